"""What every adapter of another ecosystem's envs shares: its errors, imports and async bridge.

A foreign env that raises or answers something malformed fails its episode with the reason (the
rollout records it; the batch goes on): adapters raise :class:`ForeignEnvError` naming the
ecosystem, the env and what went wrong. An env that needs a download at run time (an NLTK corpus,
a Hugging Face dataset) raises :class:`MissingResourceError` naming the resource, since these
machines reach package registries only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import math
import threading
import time
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from pydantic import Field

from srt_agent.chat.messages import Message
from srt_agent.env.multi_turn import EnvConfig, MultiTurnEnv, Observation
from srt_agent.env.registration import UnknownEnvError
from srt_agent.errors import SrtAgentError, describe_fault

__all__ = [
    "ForeignCallTimeout",
    "ForeignEnv",
    "ForeignEnvConfig",
    "ForeignEnvError",
    "HeldLock",
    "LoopThread",
    "MissingResourceError",
    "ReplyPolicy",
    "foreign_reward",
    "import_package",
    "reraise_foreign",
    "run_sync",
]

T = TypeVar("T")

# Substrings of the errors a package raises when it tries to fetch something at run time.
_DOWNLOAD_SIGNS = (
    "Resource",  # NLTK: "Resource words not found. Please use the NLTK Downloader ..."
    "nltk.download",
    "Couldn't reach",  # datasets / huggingface_hub
    "ConnectionError",
    "Max retries exceeded",
    "Name or service not known",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "offline mode is enabled",
    "LocalEntryNotFoundError",
    "Failed to resolve",
)


class ForeignEnvError(SrtAgentError, RuntimeError):
    """Another ecosystem's env raised, or answered something this adapter cannot read."""


class MissingResourceError(ForeignEnvError):
    """Another ecosystem's env needs a download at run time (a corpus, a dataset) that failed."""


class ForeignCallTimeout(ForeignEnvError, TimeoutError):
    """A call into another ecosystem's package did not finish within its deadline (``call_timeout_s``)."""


class HeldLock:
    """A lock for foreign code that can hang: a holder past ``hold_s`` is presumed hung and passed over.

    Some packages keep process-wide state a call must have to itself (TextArena seeds the global
    ``random`` at reset). A plain lock held across such a call lets one hung call stall every later
    one in the process; here a waiter takes the lock over once the holder has had it ``hold_s``
    seconds (that holder's episode fails at its own deadline). The cost, only in that case: if the
    hung call ever resumes, it may share the state with the next holder.
    """

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._cond = threading.Condition()
        self._holder: object | None = None
        self._since = 0.0
        self.passed_over = 0  # holders presumed hung

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the block (waiting at most ``hold_s`` for a holder)."""
        token = object()
        with self._cond:
            while self._holder is not None:
                left = self._since + self.hold_s - time.monotonic()
                if left <= 0:
                    self.passed_over += 1
                    break
                self._cond.wait(left)
            self._holder, self._since = token, time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                if self._holder is token:
                    self._holder = None
                    self._cond.notify()


def import_package(import_name: str, package: str, extra: str) -> ModuleType:
    """Import an ecosystem's package, or say how to install it.

    Raises:
        UnknownEnvError: The package is not installed (the message gives the pip command).
    """
    try:
        return importlib.import_module(import_name)
    except ImportError as exc:
        raise UnknownEnvError(
            f"{package} is not installed ({exc}); install it with: pip install 'srt-agent[{extra}]'"
        ) from None


def reraise_foreign(exc: BaseException, what: str) -> ForeignEnvError:
    """The error to raise for ``exc`` raised by ``what`` (e.g. ``"TextArena game Wordle-v0 at reset"``).

    A failed download becomes :class:`MissingResourceError` naming it; anything else a
    :class:`ForeignEnvError` carrying the original's type and message.
    """
    text = describe_fault(exc)
    if isinstance(exc, LookupError | OSError | ConnectionError) and any(s in text for s in _DOWNLOAD_SIGNS):
        first = " ".join(text.split())[:300]
        return MissingResourceError(
            f"{what} needs a download at run time, which failed (this machine may have no network "
            f"beyond package registries; fetch it beforehand where you can): {first}"
        )
    return ForeignEnvError(f"{what} failed: {text}")


def foreign_reward(value: Any, what: str) -> float:
    """``value``, a reward a foreign package gave, as a float; :class:`ForeignEnvError` if it is none.

    Refused: anything but an int or a float (a bool too: ``True`` is a bug, not a score), NaN and
    infinities (one would poison a whole batch's advantages).

    Args:
        value: What the package returned.
        what: Who gave it, for the message (``"TextArena game Countdown-v0's reward"``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ForeignEnvError(f"{what}: got {type(value).__name__} {str(value)[:120]!r}, not a number")
    reward = float(value)
    if not math.isfinite(reward):
        raise ForeignEnvError(f"{what}: got {reward}, not a finite number")
    return reward


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from synchronous code, whether or not this thread runs an event loop.

    An env's hooks run in worker threads (no loop there: ``asyncio.run``); called from a thread whose
    loop is running (a notebook), the coroutine runs on a loop of its own in a helper thread.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ForeignEnvConfig(EnvConfig):
    """Options every adapted env accepts, besides the base ones (``max_turns`` and so on)."""

    success_threshold: float = Field(
        1.0,
        description="An episode whose total reward reaches this counts as solved (success rates, pass^k).",
    )
    call_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Most seconds one call into the package may take (a reset's, a step's); then the "
        "episode fails naming the call. The rollout's own env deadlines apply as well.",
    )


class ForeignEnv(MultiTurnEnv):
    """Base of the adapters: the reset seed kept for :meth:`new_task`, success at ``success_threshold``.

    Another ecosystem's env is seeded with the reset seed itself (its own RNG, or the index of
    a row), not with srt-agent's ``np_random``, so the same seed is the same task there too.
    """

    config_model: ClassVar[type[EnvConfig]] = ForeignEnvConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: ForeignEnvConfig
        self._reset_seed: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start a new episode; ``seed`` picks the task (see each adapter)."""
        self._reset_seed = seed
        return super().reset(seed=seed, options=options)

    def task_seed(self, bound: int = 2**31) -> int:
        """The reset seed, or (reset without one) a draw below ``bound`` from ``np_random``."""
        if self._reset_seed is not None:
            return self._reset_seed
        return int(self.np_random.integers(bound))

    def is_success(self, total_reward: float, info: dict[str, Any]) -> bool:
        """Solved when the episode's reward reaches ``success_threshold``."""
        return total_reward >= self.config.success_threshold - 1e-9


class LoopThread:
    """One event loop in a thread of its own, for an env whose package is async throughout.

    An async env's objects (locks, clients) bind to the loop that first uses them, so each env
    instance keeps one loop for its whole life instead of a fresh ``asyncio.run`` per call; the
    env's hooks, running in the rollout's worker threads, hand their coroutines to it.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop; wait at most ``timeout`` s for its result (its exception is raised here).

        Raises:
            ForeignCallTimeout: ``coro`` was still running at the deadline; it is cancelled.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # the loop stays usable for the env's next call (its close, at least)
            raise ForeignCallTimeout(f"did not finish within {timeout:g} s (call_timeout_s)") from None

    def close(self) -> None:
        """Stop the loop and its thread (idempotent)."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass(frozen=True)
class ReplyPolicy:
    """A policy that gives the same reply every turn: the oracle of an env that knows its answer."""

    text: str

    def act(self, history: Sequence[Message]) -> str:
        """The reply."""
        return self.text

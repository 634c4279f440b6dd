"""Playing one episode against an engine, token-in/token-out, with every failure contained.

The scheduler runs many of these at once on one event loop. Everything that can block (making,
resetting, stepping and closing the env) runs in a thread of its own under a deadline, so one
episode's tool calls overlap other episodes' generation. Chat-template rendering stays on the loop:
it takes milliseconds, and HF fast tokenizers are not safe to call from several threads at once.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec

import gymnasium as gym

from srt_agent.chat.messages import Message, cap_message
from srt_agent.chat.template import ChatFormat, TemplateContinuityError, TokenTranscript
from srt_agent.contracts.generation import Engine, GenerationOutput, GenerationRequest, PromptTooLongError
from srt_agent.contracts.trajectory import Status, Trajectory, TurnRecord, json_safe
from srt_agent.env.registration import make
from srt_agent.errors import FAULTS, SrtAgentError, describe_fault, shown
from srt_agent.isolation import CallTimeout, await_in_thread
from srt_agent.rollout.config import EpisodeRequest, RolloutConfig, sampling_seed
from srt_agent.tooling.grammar import ToolCallGrammar

logger = logging.getLogger("srt_agent.rollout")
_P = ParamSpec("_P")

_SELF_TIMED_GRACE_S = 5.0  # an env process's own deadline fires first; the thread's is a backstop
_NEAR_DEADLINE = 0.5  # an env call that took this share of its deadline is warned about
_warned_near: set[tuple[str, str]] = set()


def _warn_near_deadline(env_id: str, where: str, elapsed: float, timeout: float, key: str) -> None:
    """Warn once per env and call kind that calls come close to their deadline (it may be too short)."""
    if (env_id, where) in _warned_near:
        return
    _warned_near.add((env_id, where))
    logger.warning(
        "env %s: a %s took %.1f s of its %g s deadline (rollout.%s); raise it if this env is slow by design",
        env_id,
        where,
        elapsed,
        timeout,
        key,
    )


class _EpisodeEnd(Exception):
    """Ends an episode early with a status and a reason (a truncation or a contained failure)."""

    def __init__(self, status: Status, reason: str):
        super().__init__(reason)
        self.status: Status = status
        self.reason = reason


class EnvContractError(SrtAgentError, TypeError):
    """An env returned something the multi-turn env contract does not allow (the message says what)."""


def _describe(exc: BaseException) -> str:
    """``"<Type>: <first line of the message>"``; the full message and traceback go to the log."""
    return describe_fault(exc, first_line=True)


def _shown(value: Any) -> str:
    return shown(value, 60)


def check_observation(obs: Any, where: str, max_chars: int | None = None) -> tuple[Message, ...]:
    """``obs`` as a tuple of messages, or :class:`EnvContractError` naming what is wrong.

    A message longer than ``max_chars`` is cut, with a note saying how much (the model sees every
    env message; one huge one must not fill its context or the trace).
    """
    if isinstance(obs, str | bytes) or not isinstance(obs, Sequence):
        raise EnvContractError(
            f"{where} returned observation {_shown(obs)} ({type(obs).__name__}); expected a tuple of Message"
        )
    for i, m in enumerate(obs):
        if not isinstance(m, Message):
            raise EnvContractError(
                f"{where} returned an observation whose item {i} is {_shown(m)} ({type(m).__name__}); "
                "expected Message objects (srt_agent.chat.messages)"
            )
    if max_chars is None:
        return tuple(obs)
    return tuple(cap_message(m, max_chars) for m in obs)


def check_info(info: Any, where: str) -> dict[str, Any]:
    """``info`` as a dict, or :class:`EnvContractError`."""
    if not isinstance(info, Mapping):
        what = type(info).__name__
        raise EnvContractError(f"{where} returned info {_shown(info)} ({what}); expected a dict")
    return dict(info)


def check_reward(reward: Any) -> float:
    """``reward`` as a finite float, or :class:`EnvContractError`."""
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise EnvContractError(
            f"step returned reward {_shown(reward)} ({type(reward).__name__}); expected a real number"
        )
    value = float(reward)
    if not math.isfinite(value):
        raise EnvContractError(f"step returned reward {value}; expected a finite number")
    return value


def check_step(
    result: Any, max_chars: int | None = None
) -> tuple[tuple[Message, ...], float, bool, bool, dict[str, Any]]:
    """A step's ``(obs, reward, terminated, truncated, info)``, checked; :class:`EnvContractError` if bad.

    ``max_chars``: see :func:`check_observation`.
    """
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvContractError(
            f"step returned {_shown(result)}; expected (observation, reward, terminated, truncated, info)"
        )
    obs, reward, terminated, truncated, info = result
    return (
        check_observation(obs, "step", max_chars),
        check_reward(reward),
        bool(terminated),
        bool(truncated),
        check_info(info, "step"),
    )


class EpisodeHooks:
    """What an episode tells its scheduler (metrics, run-ahead); every method is a no-op here.

    Called on the event loop: :meth:`episode_started` once, then per turn
    :meth:`generation_started`, :meth:`generation_finished`, and for a turn that reaches the env
    :meth:`step_started` and :meth:`step_finished`; :meth:`episode_finished` once at the end. A
    hook must not raise.
    """

    def episode_started(self, runner: EpisodeRunner) -> None:
        """The episode took its rollout slot and starts (before the env is made)."""

    def generation_started(self, runner: EpisodeRunner, request: GenerationRequest) -> None:
        """A live request is about to be submitted."""

    def generation_finished(self, runner: EpisodeRunner, request: GenerationRequest) -> None:
        """The live request returned (or failed)."""

    def step_started(self, runner: EpisodeRunner, transcript: TokenTranscript, action: str) -> None:
        """The env is about to step on ``action``; ``transcript`` ends with the turn's tokens."""

    def step_finished(self, runner: EpisodeRunner, action: str, observation: tuple[Message, ...]) -> None:
        """The env step returned ``observation`` (also after it failed: then it is empty)."""

    def episode_finished(self, runner: EpisodeRunner) -> None:
        """The episode is over (its trajectory is being built)."""


NO_HOOKS = EpisodeHooks()


EnvFactory = Callable[[EpisodeRequest], "gym.Env[Any, str]"]
"""Makes an episode's env from its request."""


def make_env(request: EpisodeRequest) -> gym.Env[Any, str]:
    """The episode's env, made in this process."""
    return make(request.env_id, **dict(request.env_options))


class EpisodeRunner:
    """Plays one :class:`EpisodeRequest` and builds its :class:`Trajectory` (one use per instance).

    Args:
        request: The episode.
        engine: Generates each turn.
        fmt: Renders the conversation to tokens.
        config: Sampling options and limits.
        queue_s: Seconds the episode already waited for a slot (recorded in the trajectory).
        hooks: Told about generations and env steps (the scheduler's metrics and run-ahead).
        env_factory: Makes the episode's env (default: ``make(request.env_id, **request.env_options)``;
            the Ray backend gives proxies of envs living in env workers).
    """

    def __init__(
        self,
        request: EpisodeRequest,
        engine: Engine,
        fmt: ChatFormat,
        config: RolloutConfig,
        queue_s: float = 0.0,
        hooks: EpisodeHooks = NO_HOOKS,
        env_factory: EnvFactory | None = None,
    ):
        self.request, self.engine, self.fmt, self.config = request, engine, fmt, config
        self.env_factory = env_factory or make_env
        self.queue_s = queue_s
        self.hooks = hooks
        self.env: gym.Env[Any, str] | None = None
        self.transcript: TokenTranscript | None = None
        self.task_id = ""
        self.grammar: ToolCallGrammar | None = None  # with rollout.constrain_tool_calls and tools
        self.requests: list[GenerationRequest] = []
        self.outputs: list[GenerationOutput] = []
        self.gen_times: list[float] = []
        self.rewards: list[float] = []
        self.final_obs: tuple[Message, ...] = ()
        self.info: dict[str, Any] = {}
        self.terminated = self.truncated = False
        self.tool_calls = self.tool_errors = 0
        self.env_s = self.gen_s = 0.0
        self.opening: tuple[Message, ...] = ()
        self.stuck = False
        self.env_calls: list[tuple[str, float]] = []  # (make/reset/step/close, seconds), in order

    async def run(self) -> Trajectory:
        """Play the episode to its end; never raises for env, template or engine failures."""
        t0 = time.perf_counter()
        self.hooks.episode_started(self)
        status: Status = "ok"
        reason = ""
        try:
            await self._play()
        except _EpisodeEnd as end:
            status, reason = end.status, end.reason
            if status == "failed":  # with the original error's traceback (not this wrapper's)
                episode = self.request.episode_id
                logger.warning("episode %s failed: %s", episode, reason, exc_info=end.__cause__)
            else:
                logger.debug("episode %s truncated: %s", self.request.episode_id, reason)
        except FAULTS as exc:  # a fault no step above contained (a bug): still this episode's alone
            status, reason = "failed", f"internal error: {_describe(exc)}"
            logger.error("episode %s failed: %s", self.request.episode_id, reason, exc_info=True)
        finally:
            self.hooks.episode_finished(self)
            await self._close()
        success = status != "failed" and self._success()
        return self._trajectory(status, reason, success, time.perf_counter() - t0)

    # ------------------------------------------------------------------ the turn loop
    async def _play(self) -> None:
        opening, tools = await self._reset()
        try:
            self.grammar = tool_grammar(tools, self.config)
        except ValueError as exc:
            raise _EpisodeEnd("failed", f"tool-call grammar: {_describe(exc)}") from exc
        self.transcript = self._render(self.fmt.start, opening, tools)
        cap = self.config.max_turns
        while True:
            if cap is not None and len(self.outputs) >= cap:
                self.truncated = True
                raise _EpisodeEnd("truncated", f"max_turns: {cap} turns reached (rollout limit)")
            out = await self._generate(self.transcript)
            self.transcript = self._render(
                self.fmt.add_generation, self.transcript, out.token_ids, out.logprobs
            )
            obs = await self._step(self.transcript, self.fmt.assistant_text(out.token_ids))
            if self.terminated:
                return
            if self.truncated:
                why = self.info.get("truncation_reason") or "the env ended the episode"
                raise _EpisodeEnd("truncated", f"env truncated: {why}")
            self.transcript = self._render(self.fmt.add_observation, self.transcript, obs)

    async def _reset(self) -> tuple[tuple[Message, ...], list[dict[str, Any]]]:
        request = self.request
        t = time.perf_counter()
        where = "make"
        try:
            self.env = env = await self._env_call("make", functools.partial(self.env_factory, request))
            where = "reset"
            options = None if request.reset_options is None else dict(request.reset_options)
            result = await self._env_call(
                "reset", functools.partial(env.reset, seed=request.seed, options=options)
            )
            if not isinstance(result, tuple) or len(result) != 2:
                raise EnvContractError(f"reset returned {_shown(result)}; expected (observation, info)")
            limit = self.config.max_observation_chars
            opening, info = check_observation(result[0], "reset", limit), check_info(result[1], "reset")
        except _EpisodeEnd:
            raise
        except FAULTS as exc:  # contained: this episode fails, the others go on
            raise _EpisodeEnd("failed", f"env raised {_describe(exc)} in {where}") from exc
        finally:
            self.env_s += time.perf_counter() - t
        self.info = info
        self.task_id = str(info.get("task_id", ""))
        self.opening = opening
        return self.opening, list(info.get("tools") or ())

    def _render(
        self, fn: Callable[_P, TokenTranscript], *args: _P.args, **kwargs: _P.kwargs
    ) -> TokenTranscript:
        """Run a ChatFormat step; a template or continuity error fails the episode."""
        try:
            return fn(*args, **kwargs)
        except (TemplateContinuityError, ValueError) as exc:
            raise _EpisodeEnd("failed", f"chat template: {_describe(exc)}") from exc

    def _request(self, transcript: TokenTranscript) -> GenerationRequest:
        """The next turn's request, with max_new_tokens clamped to the context left."""
        turn = len(self.outputs)
        base = self.config.seed
        n, limit = len(transcript), self.engine.max_context
        params = self.config.turn_sampling(
            prompt_len=n,
            max_context=limit,
            stop_token_ids=self.fmt.stop_token_ids,
            seed=None if base is None else sampling_seed(base, self.request.episode_id, turn),
        )
        if params is None:
            self.truncated = True
            raise _EpisodeEnd(
                "truncated",
                f"context limit: {limit} tokens (prompt is {n}, a turn needs {self.config.turn_room} more)",
            )
        return GenerationRequest(
            request_id=f"{self.request.episode_id}#{turn}",
            prompt_ids=transcript.token_ids,
            params=params,
            task_id=self.task_id,
            draft_group=self.request.env_id,
            tool_grammar=self.grammar,
        )

    async def _generate(self, transcript: TokenTranscript) -> GenerationOutput:
        req = self._request(transcript)
        t = time.perf_counter()
        self.hooks.generation_started(self, req)
        try:
            out = await self.engine.agenerate(req)
        except PromptTooLongError as exc:
            self.truncated = True
            raise _EpisodeEnd("truncated", f"context limit: {exc}") from exc
        except Exception as exc:  # contained: this episode fails, the others go on
            raise _EpisodeEnd("failed", f"engine raised {_describe(exc)}") from exc
        finally:
            elapsed = time.perf_counter() - t
            self.gen_s += elapsed
            self.hooks.generation_finished(self, req)
        if out.finish_reason == "abort":
            raise _EpisodeEnd("failed", f"engine aborted: {out.error or 'no reason given'}")
        if not out.token_ids or len(out.token_ids) != len(out.logprobs):
            raise _EpisodeEnd(
                "failed",
                f"engine aborted: bad output ({len(out.token_ids)} tokens, {len(out.logprobs)} logprobs)",
            )
        self.requests.append(req)
        self.outputs.append(out)
        self.gen_times.append(elapsed)
        return out

    async def _step(self, transcript: TokenTranscript, action: str) -> tuple[Message, ...]:
        assert self.env is not None
        t = time.perf_counter()
        self.hooks.step_started(self, transcript, action)
        obs: tuple[Message, ...] = ()
        try:
            result = await self._env_call("step", functools.partial(self.env.step, action))
            obs, reward, terminated, truncated, info = check_step(result, self.config.max_observation_chars)
        except _EpisodeEnd:
            raise
        except FAULTS as exc:  # contained: this episode fails, the others go on
            raise _EpisodeEnd("failed", f"env raised {_describe(exc)} in step") from exc
        finally:
            self.env_s += time.perf_counter() - t
            self.hooks.step_finished(self, action, obs)
        # The step's reward is credited to the turn whose action caused it (the last one).
        self.rewards.append(reward)
        self.terminated, self.truncated, self.info = terminated, truncated, info
        try:
            self.tool_calls += int(info.get("tool_calls", 0) or 0)
            errors = info.get("tool_errors") or ()
            self.tool_errors += errors if isinstance(errors, int) else len(errors)
        except (TypeError, ValueError):  # counts an env reports oddly are not worth the episode
            logger.warning("episode %s: unreadable tool counts in step info", self.request.episode_id)
        if self.terminated or self.truncated:
            self.final_obs = obs
        return obs

    # ------------------------------------------------------------------ ending
    async def _env_call(self, where: str, fn: Callable[[], Any]) -> Any:
        """Run env code (``make``, ``reset``, ``step``, ``close``) in a thread, under its deadline.

        ``make`` and ``reset`` get ``env_setup_timeout_s``, ``step`` and ``close``
        ``env_step_timeout_s``. An env that hangs fails its episode, not the batch. A thread per
        call, not a pool's: a hung call would keep its pool worker, and enough of them would starve
        every other episode. An env that overran once is not called again (its state is unknown;
        its thread may still be in it). Envs in worker processes time their own calls (and kill
        the worker at the deadline), so their thread waits a little longer than the deadline.
        """
        if self.stuck:
            raise _EpisodeEnd("failed", f"env {where} not attempted: an earlier call overran")
        setup = where in ("make", "reset")
        timeout = self.config.env_setup_timeout_s if setup else self.config.env_step_timeout_s
        key = "env_setup_timeout_s" if setup else "env_step_timeout_s"
        self_timed = bool(getattr(self.env_factory, "self_timed", False))
        wait = timeout + _SELF_TIMED_GRACE_S if self_timed and timeout is not None else timeout
        t = time.perf_counter()
        try:
            return await await_in_thread(fn, wait, name=f"srt-env-{where}")
        except CallTimeout:
            self.stuck = True
            killed = "; its process was killed" if self_timed else ""
            raise _EpisodeEnd(
                "failed", f"env {where} did not return within {timeout:g} s (rollout.{key}){killed}"
            ) from None
        finally:
            elapsed = time.perf_counter() - t
            self.env_calls.append((where, elapsed))
            if timeout is not None and _NEAR_DEADLINE * timeout <= elapsed < timeout:
                _warn_near_deadline(self.request.env_id, where, elapsed, timeout, key)

    async def _close(self) -> None:
        if self.env is None or self.stuck:  # a stuck env is left to its thread (logged as failed)
            return
        t = time.perf_counter()
        try:
            await self._env_call("close", self.env.close)
        except (_EpisodeEnd, Exception, SystemExit, KeyboardInterrupt):  # FAULTS: the result stands
            logger.warning("episode %s: env.close() failed", self.request.episode_id, exc_info=True)
        self.env_s += time.perf_counter() - t

    def _success(self) -> bool:
        if self.env is None:
            return False
        total = sum(self.rewards)
        judge = getattr(self.env.unwrapped, "is_success", None)
        if not callable(judge):  # a plain gymnasium env: the built-in envs' convention
            return total >= 1.0 - 1e-9
        try:
            return bool(judge(total, self.info))
        except FAULTS:  # a broken judge counts as not solved, and is logged
            logger.warning("episode %s: is_success raised", self.request.episode_id, exc_info=True)
            return False

    def _turn_records(self) -> tuple[TurnRecord, ...]:
        spans: Sequence[tuple[int, int]] = self.transcript.turn_spans if self.transcript else ()
        rewards = self.rewards + [0.0] * (len(spans) - len(self.rewards))
        steps = [s for where, s in self.env_calls if where == "step"]  # one per turn that reached the env
        steps += [0.0] * (len(spans) - len(steps))
        return tuple(
            TurnRecord(
                index=i,
                start=s,
                end=e,
                state_key=req.state_key,
                finish_reason=out.finish_reason,
                reward=rewards[i],
                forward_passes=out.forward_passes,
                sampling_seed=req.params.seed,
                generation_s=gen_s,
                env_s=steps[i],
            )
            for i, ((s, e), req, out, gen_s) in enumerate(
                zip(spans, self.requests, self.outputs, self.gen_times, strict=False)
            )
        )

    def _trajectory(self, status: Status, reason: str, success: bool, wall_s: float) -> Trajectory:
        tr = self.transcript
        turns = self._turn_records()
        return Trajectory(
            episode_id=self.request.episode_id,
            env_id=self.request.env_id,
            task_id=self.task_id,
            seed=self.request.seed,
            trial=self.request.trial,
            token_ids=tr.token_ids if tr else (),
            loss_mask=tr.loss_mask if tr else (),
            logprobs=tr.logprobs if tr else (),
            turns=turns,
            total_reward=sum(self.rewards),
            success=success,
            terminated=self.terminated,
            truncated=self.truncated,
            status=status,
            reason=reason,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            messages=(tr.messages if tr else self.opening) + self.final_obs,
            final_info=json_safe(self.info),
            generation_s=self.gen_s,
            env_s=self.env_s,
            setup_s=sum(s for where, s in self.env_calls if where in ("make", "reset")),
            queue_s=self.queue_s,
            wall_s=wall_s,
            tool_grammar=self.grammar,
        )


def tool_grammar(tools: Sequence[Any], config: RolloutConfig) -> ToolCallGrammar | None:
    """The grammar a rollout decodes an env's tool calls under, one shared object per tool set.

    ``None`` unless ``config.constrain_tool_calls`` and the env announced tools; with
    ``config.copy_tool_arguments`` string values are copied from the conversation (see
    :class:`ToolCallGrammar`). Live episodes and announced run-ahead requests both ask here, so
    they decode alike. The engine's mask cache is keyed by grammar; one shared object keeps its
    keys few.

    Raises:
        ValueError: A tool schema the grammar cannot express.
    """
    if not (config.constrain_tool_calls and tools):
        return None
    return _grammar(json.dumps(list(tools), sort_keys=True, default=str), config.copy_tool_arguments)


@functools.lru_cache(maxsize=64)
def _grammar(tools_json: str, copy_strings: bool) -> ToolCallGrammar:
    return ToolCallGrammar.from_schemas(json.loads(tools_json), copy_strings)

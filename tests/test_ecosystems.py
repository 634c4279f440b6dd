"""The plumbing shared by the adapters of other ecosystems' envs (no ecosystem package needed).

Each adapter has its own tier with its real package (``-m textarena``, ``-m reasoning_gym``,
``-m verifiers``, ``-m openenv``); this checks prefixes, errors and the async bridge.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from typer.testing import CliRunner

from srt_agent.cli import app
from srt_agent.env.registration import UnknownEnvError, check_env_id, env_prefixes
from srt_agent.integrations.ecosystems import _ALIASES, ECOSYSTEMS, ecosystem
from srt_agent.integrations.ecosystems.foreign import (
    ForeignCallTimeout,
    ForeignEnvError,
    HeldLock,
    LoopThread,
    MissingResourceError,
    foreign_reward,
    import_package,
    reraise_foreign,
    run_sync,
)


def test_every_ecosystem_names_an_adapter_module_and_an_extra() -> None:
    assert set(ECOSYSTEMS) == {"textarena", "reasoning_gym", "verifiers", "openenv"}
    for eco in ECOSYSTEMS.values():
        assert importlib.util.find_spec(eco.adapter) is not None, eco.adapter
        assert eco.example.startswith(f"{eco.prefix}:")
    assert ecosystem("reasoning-gym") is ECOSYSTEMS["reasoning_gym"] and ecosystem("srt") is None


def test_every_prefix_and_alias_is_declared_as_an_entry_point_of_its_adapter() -> None:
    declared = env_prefixes()
    assert set(declared) == set(ECOSYSTEMS) | set(_ALIASES)
    for prefix, entry in declared.items():
        resolver = entry.load()
        assert resolver.args == (ecosystem(prefix).prefix,)  # type: ignore[union-attr]


def test_a_missing_package_says_how_to_install_it() -> None:
    with pytest.raises(UnknownEnvError, match=r"pip install 'srt-agent\[textarena\]'"):
        import_package("textarena_not_installed_here", "textarena", "textarena")
    for eco in ECOSYSTEMS.values():
        if eco.installed_version() is None:
            with pytest.raises(UnknownEnvError, match=rf"srt-agent\[{eco.extra}\]"):
                check_env_id(eco.example)


def test_failed_downloads_are_told_apart_from_other_failures() -> None:
    nltk = LookupError(
        "\n  Resource words not found.\n  Please use the NLTK Downloader to obtain the resource"
    )
    assert isinstance(reraise_foreign(nltk, "TextArena game Wordle-v0 at reset"), MissingResourceError)
    hub = OSError("Couldn't reach 'openai/gsm8k' on the Hub (ConnectionError)")
    assert "needs a download" in str(reraise_foreign(hub, "verifiers environment 'gsm8k'"))
    plain = reraise_foreign(ValueError("bad move"), "a game")
    assert type(plain) is ForeignEnvError and str(plain) == "a game failed: ValueError: bad move"


def test_foreign_rewards_must_be_finite_numbers() -> None:
    assert foreign_reward(1, "x") == 1.0 and foreign_reward(0.25, "x") == 0.25
    for bad, shown in [
        ("invalid move", "got str 'invalid move', not a number"),
        (True, "got bool 'True', not a number"),
        (None, "got NoneType 'None', not a number"),
        (float("nan"), "got nan, not a finite number"),
        (float("-inf"), "got -inf, not a finite number"),
    ]:
        with pytest.raises(ForeignEnvError, match=f"^TextArena game G's reward: {shown}$"):
            foreign_reward(bad, "TextArena game G's reward")


def test_coroutines_run_from_sync_code_with_or_without_a_running_loop() -> None:
    async def two() -> int:
        return 2

    assert run_sync(two()) == 2

    async def inside() -> int:
        return run_sync(two())  # a loop runs in this thread: the coroutine gets its own

    assert asyncio.run(inside()) == 2
    loop = LoopThread("test")
    try:
        assert loop.run(two()) == 2
        with pytest.raises(KeyError):
            loop.run(_raise())  # the coroutine's exception comes back to the caller
        with pytest.raises(ForeignCallTimeout, match=r"did not finish within 0\.2 s"):
            loop.run(asyncio.sleep(30), timeout=0.2)  # a hung coroutine is cancelled at its deadline
        assert loop.run(two(), timeout=1) == 2  # and the loop serves the next call
    finally:
        loop.close()
    loop.close()  # idempotent


async def _raise() -> None:
    raise KeyError("x")


def test_a_held_lock_passes_over_a_holder_that_hangs() -> None:
    import threading
    import time

    lock = HeldLock(hold_s=0.3)
    release = threading.Event()

    def hang() -> None:
        with lock.held():
            release.wait(10)

    hung = threading.Thread(target=hang, daemon=True)
    hung.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    with lock.held():  # waits out the 0.3 s the holder may keep it, not the hang
        waited = time.perf_counter() - t0
    assert 0.2 < waited < 1.0 and lock.passed_over == 1
    release.set()
    hung.join(2)
    t0 = time.perf_counter()
    order: list[int] = []

    def short(i: int) -> None:
        with lock.held():
            order.append(i)
            time.sleep(0.05)

    threads = [threading.Thread(target=short, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(order) == [0, 1, 2] and lock.passed_over == 1  # quick holders are waited for


def test_envs_lists_the_ecosystems() -> None:
    result = CliRunner().invoke(app, ["envs"])
    assert result.exit_code == 0, result.output
    for eco in ECOSYSTEMS.values():
        assert f"{eco.prefix}:" in result.output

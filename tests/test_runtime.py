"""The one runtime builder: engine, draft source and scheduler wired the same way for every command."""

from __future__ import annotations

from pathlib import Path

import pytest
from chat_fixtures import save_tiny_llama
from test_rollout_support import tiny_format

from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.rollout import EpisodeRequest
from srt_agent.rollout.config import RolloutConfig, RunAheadConfig
from srt_agent.rollout.scheduler import rollout_sync
from srt_agent.runtime import build_runtime
from srt_agent.tree_cache import TreeCache


def test_runtime_wires_the_cache_and_run_ahead_and_rolls_out(tmp_path: Path) -> None:
    model = save_tiny_llama(tmp_path / "m")
    with pytest.raises(ValueError, match="run-ahead only feeds a draft source"):
        build_runtime(model, RolloutConfig(), run_ahead=RunAheadConfig(enabled=True), fmt=tiny_format())
    cache = TreeCache()
    rollout = RolloutConfig(max_concurrent=4, max_new_tokens=8)
    with build_runtime(
        model,
        rollout,
        draft_source=cache,
        run_ahead=RunAheadConfig(enabled=True),
        fmt=tiny_format(),
        spec=SpecConfig(runahead_slowdown=10),  # the wiring, not the ledger: run-ahead always admitted
    ) as rt:
        assert rt.cache is cache and rt.scheduler.runahead is not None
        # The next batch is announced: its first turn is generated ahead, into the cache only.
        assert rt.scheduler.announce([EpisodeRequest("srt/GuessNumber-v0", seed=9)]) == 1
        batch = rollout_sync(rt.scheduler, [EpisodeRequest("srt/GuessNumber-v0", seed=i) for i in range(2)])
    assert len(batch.trajectories) == 2 and cache.stats().tokens_added > 0  # the engine reported to it
    assert batch.metrics.runahead.started == batch.metrics.runahead.completed == 1
    assert batch.metrics.spec.runahead_tokens > 0
    with build_runtime(model, rollout, fmt=tiny_format()) as plain:
        assert plain.cache is None and plain.scheduler.runahead is None
    # The default ("auto") does not run ahead on a CPU engine, and without a draft source it is off.
    with build_runtime(
        model, rollout, draft_source=TreeCache(), run_ahead=RunAheadConfig(), fmt=tiny_format()
    ) as cpu:
        assert cpu.scheduler.runahead is None
    with build_runtime(model, rollout, run_ahead=RunAheadConfig(), fmt=tiny_format()) as none:
        assert none.scheduler.runahead is None

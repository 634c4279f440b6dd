"""The engine benchmark runs end to end on a tiny model and reports a flat record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srt_agent.speed.engine_speed import bench_engine, run_engine_bench
from srt_agent.speed.random_model import save_random_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_run_engine_bench_reports_both_systems(tmp_path: Path) -> None:
    model = save_random_model(tmp_path / "m")
    record = run_engine_bench(model, batch_sizes=(1, 3), new_tokens=4, prompt_len=5, repeats=1)
    for b in (1, 3):
        engine, hf = record[f"torch_engine_tok_s_b{b}"], record[f"hf_generate_tok_s_b{b}"]
        assert isinstance(engine, float) and isinstance(hf, float) and engine > 0 and hf > 0
        # Relative: with 4 new tokens on a busy machine a decode time can round to ~0 (a huge rate).
        assert float(record[f"speedup_b{b}"]) == pytest.approx(engine / hf, rel=0.01, abs=0.01)
    assert record["model"] == str(model) and record["params"] > 0


def test_bench_engine_writes_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import srt_agent.speed.engine_speed as bench

    model = save_random_model(tmp_path / "m")
    real = bench.run_engine_bench

    def small(model_dir: Path | None, num_threads: int | None) -> dict[str, float | int | str]:
        return real(
            model_dir, batch_sizes=(1,), new_tokens=3, prompt_len=3, repeats=1, num_threads=num_threads
        )

    monkeypatch.setattr(bench, "run_engine_bench", small)  # keep the CLI entry fast
    out = tmp_path / "out" / "bench.json"
    record = bench_engine(model, out, num_threads=1)
    assert json.loads(out.read_text()) == record
    assert "speedup_b1" in record

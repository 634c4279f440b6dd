"""Atomic checkpoints and in-process resume (the real kill -9 test is in test_train_kill.py)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from train_fixtures import save_tiny_policy, tiny_config

from srt_agent.train import Trainer, TrainError, latest_checkpoint, list_checkpoints
from srt_agent.train.checkpoint import (
    KEEP,
    checkpoint_root,
    clean_partial,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from srt_agent.train.metrics_log import MetricsLogger, read_records


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


def write_one(path: Path) -> None:
    (path / "weights.bin").write_bytes(b"x" * 100)


def test_a_crash_while_writing_leaves_the_previous_checkpoint_in_charge(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 1, {"note": "first"}, write_one)

    def crash(path: Path) -> None:
        write_one(path)
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path, 2, {}, crash)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.step == 1 and latest.state["note"] == "first"
    leftovers = [p.name for p in checkpoint_root(tmp_path).iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == [f".tmp-step-000002-{__import__('os').getpid()}"]
    assert clean_partial(tmp_path) and not any(
        p.name.startswith(".") for p in checkpoint_root(tmp_path).iterdir()
    )


def test_incomplete_or_foreign_directories_are_never_picked_up(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 3, {}, write_one)
    root = checkpoint_root(tmp_path)
    (root / "step-000009").mkdir()  # no state.json: a writer that never finished (or a hand-made dir)
    (root / ".tmp-step-000010-123").mkdir()
    wrong = root / "step-000011"
    wrong.mkdir()
    (wrong / "state.json").write_text(json.dumps({"step": 12, "format": "srt-train-ckpt/1"}))
    torn = root / "step-000012"
    torn.mkdir()
    (torn / "state.json").write_text('{"step": 12, "form')  # torn write
    assert [c.step for c in list_checkpoints(tmp_path)] == [3]


def test_a_step_directory_whose_state_json_is_unusable_is_reported_with_why(tmp_path: Path) -> None:
    from srt_agent.train.checkpoint import resume_order

    write_checkpoint(tmp_path, 3, {}, write_one)
    root = checkpoint_root(tmp_path)
    broken = {
        9: None,  # no state.json
        11: json.dumps({"step": 12, "format": "srt-train-ckpt/2"}),
        12: '{\n  "finite": true,\n  "format": "srt-train-ckpt/2"\n  "st',  # torn: truncated
        13: "[1, 2]",
        14: json.dumps({"step": 14, "format": "srt-train-ckpt/99"}),
        15: json.dumps({"step": "x" * 100_000, "format": "srt-train-ckpt/2"}),  # a huge value: bounded
        16: b"\xff\xfe not utf-8",
        17: b" " * (1 << 20) + b"{}",  # too big to be a trainer's state: not read whole
    }
    for step, text in broken.items():
        (root / f"step-{step:06d}").mkdir()
        if isinstance(text, str):
            (root / f"step-{step:06d}" / "state.json").write_text(text)
        elif isinstance(text, bytes):
            (root / f"step-{step:06d}" / "state.json").write_bytes(text)
    (root / ".tmp-step-000020-123").mkdir()  # a killed writer's: normal after kill -9, never reported
    (root / ".tmp-step-000021-123").mkdir()
    (root / ".tmp-step-000021-123" / "state.json").write_text("{")
    notes = [f"{c.path.name}: {why}" for c, why in resume_order(tmp_path)]
    assert notes[:-1] == [
        "step-000017: state.json is over 1048576 bytes (a trainer's state is a few hundred)",
        "step-000016: state.json is not UTF-8 text (a bad byte at offset 0)",
        f"step-000015: state.json names step '{'x' * 17}...{'x' * 18}', not 15",
        "step-000014: state.json has format 'srt-train-ckpt/99', which this version does not read",
        "step-000013: state.json holds a JSON list, not an object",
        "step-000012: state.json is not valid JSON (truncated?): Expecting ',' delimiter: line 4 column 3",
        "step-000011: state.json names step 12, not 11",
        "step-000009: state.json is missing (the checkpoint is incomplete or was damaged)",
    ]
    assert notes[-1] == "step-000003: " and all(len(n) < 200 and "\n" not in n for n in notes)
    assert [c.step for c in list_checkpoints(tmp_path)] == [3]  # listing and pruning see only complete ones


def test_old_checkpoints_are_pruned(tmp_path: Path) -> None:
    for step in range(1, 6):
        write_checkpoint(tmp_path, step, {}, write_one)
    assert [c.step for c in list_checkpoints(tmp_path)] == list(range(6 - KEEP, 6))
    again = write_checkpoint(tmp_path, 5, {"again": True}, write_one)  # same step: replaced whole
    assert again.state["again"] and latest_checkpoint(tmp_path) == again


def test_rng_states_round_trip() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = rng_state()
    path_draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(saved)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == path_draws


def test_metrics_drop_records_past_the_checkpoint_on_resume(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, ["jsonl"])
    for step in (1, 2, 3):
        logger.log({"kind": "step", "step": step, "x": float("nan")})
    logger.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "step", "st')  # a line torn by kill -9
    resumed = MetricsLogger(tmp_path, ["jsonl"], resume_step=2)
    assert [r["step"] for r in resumed.records()] == [1, 2] and resumed.records()[0]["x"] is None
    resumed.close()
    fresh = MetricsLogger(tmp_path, ["jsonl"])
    assert fresh.records() == []
    fresh.close()


def test_tensorboard_sink_writes_events(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    logger = MetricsLogger(tmp_path, ["jsonl", "tensorboard"])
    logger.log({"kind": "step", "step": 1, "reward_mean": 0.5})
    logger.close()
    assert logger.tensorboard_error is None
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_without_tensorboard_metrics_still_go_to_jsonl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    logger = MetricsLogger(tmp_path, ["jsonl", "tensorboard"])
    logger.log({"kind": "step", "step": 1, "reward_mean": 0.5})
    logger.close()
    assert logger.tensorboard_error is not None and "srt-agent[train]" in logger.tensorboard_error
    assert read_records(tmp_path / "metrics.jsonl") == [{"kind": "step", "step": 1, "reward_mean": 0.5}]


def test_resume_continues_after_the_checkpoint_and_matches_an_uninterrupted_run(
    model_dir: Path, tmp_path: Path
) -> None:
    straight = Trainer(tiny_config(model_dir, tmp_path / "straight", trainer={"steps": 3}))
    try:
        full = [r for r in straight.run() if r["kind"] == "step"]
        final = straight.policy.lm_state_dict()
    finally:
        straight.close()

    out = tmp_path / "interrupted"
    first = Trainer(tiny_config(model_dir, out, trainer={"steps": 2}))
    try:
        first.run()
    finally:
        first.close()
    # A crash while step 3 was in flight: its metrics line was written, its checkpoint was not.
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "step", "step": 3, "reward_mean": 123.0}) + "\n")
    (checkpoint_root(out) / ".tmp-step-000003-999").mkdir()

    cfg = tiny_config(model_dir, out, trainer={"steps": 3})
    with pytest.raises(TrainError, match="--resume"):
        Trainer(cfg)  # a fresh start must not silently mix with an earlier run
    resumed = Trainer(cfg, resume=True)
    try:
        assert resumed.resumed_from == 2 and resumed.state.eval_before is not None
        assert not (checkpoint_root(out) / ".tmp-step-000003-999").exists()
        resumed.run()
        steps = [r for r in read_records(out / "metrics.jsonl") if r["kind"] == "step"]
        assert [r["step"] for r in steps] == [1, 2, 3]
        for key in ("reward_mean", "gen_tokens", "pg_loss", "entropy"):  # same prompts, seeds, weights, RNG
            assert steps[2][key] == pytest.approx(full[2][key], rel=1e-5), key
        after = resumed.policy.lm_state_dict()
        assert all(torch.allclose(after[k], final[k], atol=1e-6) for k in final)
        assert latest_checkpoint(out) is not None and latest_checkpoint(out).step == 3  # type: ignore[union-attr]
    finally:
        resumed.close()


def test_a_damaged_file_is_caught_by_the_manifest(tmp_path: Path) -> None:
    from srt_agent.train.checkpoint import resume_order, verify_checkpoint

    first = write_checkpoint(tmp_path, 1, {}, write_one)
    second = write_checkpoint(tmp_path, 2, {}, write_one)
    assert verify_checkpoint(first) == [] and verify_checkpoint(second) == []
    (second.path / "weights.bin").write_bytes(b"x" * 40)  # truncated
    assert verify_checkpoint(second) == ["weights.bin has 40 bytes, 100 were written"]
    (second.path / "weights.bin").write_bytes(b"y" * 100)  # same size, other bytes
    assert verify_checkpoint(second) == ["weights.bin does not match its checksum"]
    order = [(c.step, why) for c, why in resume_order(tmp_path)]
    assert [step for step, why in order if not why] == [1]
    assert [f"step-00000{step}: {why}" for step, why in order if why] == [
        "step-000002: damaged (weights.bin does not match its checksum)"
    ]


def test_pruning_keeps_the_newest_checkpoint_with_finite_weights(tmp_path: Path) -> None:
    from srt_agent.train.checkpoint import resume_order

    write_checkpoint(tmp_path, 1, {"finite": True}, write_one)
    for step in range(2, 6):  # the run diverged after step 1
        write_checkpoint(tmp_path, step, {"finite": False}, write_one)
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 4, 5]
    order = [(c.step, why) for c, why in resume_order(tmp_path)]
    usable, skipped = [step for step, why in order if not why], [why for _, why in order if why]
    assert usable == [1] and len(skipped) == 2 and "not finite" in skipped[0]


def test_resume_falls_back_past_damaged_and_nan_checkpoints_and_says_so(
    model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = tiny_config(model_dir, out, trainer={"steps": 3})
    with pytest.raises(TrainError, match="nothing to resume"):
        Trainer(cfg, resume=True)  # --resume with nothing there is an error, not a fresh start
    first = Trainer(cfg)
    try:
        first.run()
    finally:
        first.close()
    root = checkpoint_root(out)
    assert [c.step for c in list_checkpoints(out)] == [2, 3]
    # Step 3's weights file was truncated; step 2's weights went NaN (its state says so).
    weights = root / "step-000003" / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    state_file = root / "step-000002" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps({**state, "finite": False}))
    with pytest.raises(TrainError, match=r"no checkpoint in .* can be resumed"):
        Trainer(cfg, resume=True)
    # With an intact, finite step 1 still there, resuming goes back to it.
    again = Trainer(tiny_config(model_dir, tmp_path / "again", trainer={"steps": 1}))
    try:
        again.run()
    finally:
        again.close()
    import shutil

    shutil.copytree(checkpoint_root(tmp_path / "again") / "step-000001", root / "step-000001")
    resumed = Trainer(cfg, resume=True)
    try:
        assert resumed.resumed_from == 1
        assert [n.split(":")[0] for n in resumed.resume_notes] == ["step-000003", "step-000002"]
        assert "model/model.safetensors has" in resumed.resume_notes[0]
        assert "not finite" in resumed.resume_notes[1]
    finally:
        resumed.close()


def test_resume_says_why_it_passes_over_a_checkpoint_with_a_truncated_state_json(
    model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = tiny_config(model_dir, out, trainer={"steps": 3})
    first = Trainer(tiny_config(model_dir, out))
    try:
        first.run()
    finally:
        first.close()
    root = checkpoint_root(out)
    state_file = root / "step-000002" / "state.json"
    state_file.write_text(state_file.read_text()[:40])  # cut short by a bad copy or disk
    resumed = Trainer(cfg, resume=True)
    try:
        assert resumed.resumed_from == 1
        [note] = resumed.resume_notes
        assert note.startswith("step-000002: state.json is not valid JSON (truncated?): "), note
    finally:
        resumed.close()
    # With no usable checkpoint left, resuming fails and says why (not "nothing to resume").
    (root / "step-000001" / "state.json").unlink()
    with pytest.raises(TrainError, match=r"no checkpoint in .* can be resumed") as caught:
        Trainer(cfg, resume=True)
    assert "step-000002: state.json is not valid JSON (truncated?)" in str(caught.value)
    assert "step-000001: state.json is missing" in str(caught.value)


def test_nan_weights_are_marked_and_never_pruned_away_behind_them(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    trainer = Trainer(tiny_config(model_dir, out, trainer={"steps": 1}))
    try:
        trainer.run()
        good = latest_checkpoint(out)
        assert good is not None and good.state["finite"] is True
        with torch.no_grad():
            next(trainer.policy.parameters()).fill_(float("nan"))
        for step in (2, 3, 4):
            trainer.state.step = step
            trainer.save_checkpoint()
    finally:
        trainer.close()
    assert [c.step for c in list_checkpoints(out)] == [1, 3, 4]
    assert [c.finite for c in list_checkpoints(out)] == [True, False, False]

"""Resuming checks the tensors it loaded for NaN and inf, also when the manifest was rewritten to match.

The manifest proves a checkpoint's bytes are the ones written (or rewritten along with it); it says
nothing about what they hold. A checkpoint whose weights, value head or optimizer state hold NaN or
inf is passed over like a damaged one, with a note that names the file and the tensor.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from train_fixtures import save_tiny_policy, tiny_config

from srt_agent.train import Trainer, TrainError
from srt_agent.train.checkpoint import (
    Checkpoint,
    NonFiniteWeights,
    check_finite,
    checkpoint_root,
    list_checkpoints,
    verify_checkpoint,
)

TENSOR = "model.layers.0.mlp.up_proj.weight"
NON_FINITE = "model/model.safetensors holds non-finite values"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"))


@pytest.fixture(scope="module")
def finished_run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run with its checkpoints of steps 1 and 2 (copied by each test that changes them)."""
    out = tmp_path_factory.mktemp("run") / "run"
    trainer = Trainer(tiny_config(model_dir, out))
    try:
        trainer.run()
    finally:
        trainer.close()
    assert [c.step for c in list_checkpoints(out)] == [1, 2]
    return out


def copy_run(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def step_dir(out: Path, step: int) -> Path:
    return checkpoint_root(out) / f"step-{step:06d}"


def rewrite_manifest(ckpt_dir: Path, name: str) -> None:
    """What an attacker (or a careless tool) does: make the manifest match the new bytes."""
    manifest_file = ckpt_dir / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    data = (ckpt_dir / name).read_bytes()
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest_file.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def poison_weights(ckpt_dir: Path, value: float = float("nan"), tensor: str = TENSOR) -> None:
    weights = ckpt_dir / "model" / "model.safetensors"
    tensors = load_file(weights)
    tensors[tensor][0, 0] = value
    save_file(tensors, weights, metadata={"format": "pt"})
    rewrite_manifest(ckpt_dir, "model/model.safetensors")
    state = json.loads((ckpt_dir / "state.json").read_text())
    assert state["finite"] is True  # the state still says the weights were finite when saved
    assert verify_checkpoint(Checkpoint(ckpt_dir, state["step"], state)) == []  # the manifest passes


def resume(model_dir: Path, out: Path, **trainer: object) -> Trainer:
    return Trainer(tiny_config(model_dir, out, trainer={"steps": 3, **trainer}), resume=True)


def test_nan_weights_under_a_rewritten_manifest_are_skipped_with_a_note(
    model_dir: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = copy_run(finished_run, tmp_path)
    poison_weights(step_dir(out, 2))
    resumed = resume(model_dir, out)
    try:
        assert resumed.resumed_from == 1
        assert resumed.resume_notes == [
            f"step-000002: model/model.safetensors holds non-finite values (NaN in '{TENSOR}')"
        ]
        assert all(bool(torch.isfinite(p).all()) for p in resumed.policy.parameters())
        records = resumed.run()  # and it trains on from step 1 with finite weights
        assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3]
        assert all(bool(torch.isfinite(p).all()) for p in resumed.policy.parameters())
    finally:
        resumed.close()


def test_resume_fails_when_every_checkpoint_holds_non_finite_weights(
    model_dir: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = copy_run(finished_run, tmp_path)
    poison_weights(step_dir(out, 2))
    poison_weights(step_dir(out, 1), float("-inf"), "lm_head.weight")
    with pytest.raises(TrainError, match=r"no checkpoint in .* can be resumed") as caught:
        resume(model_dir, out)
    message = str(caught.value)
    assert f"step-000002: model/model.safetensors holds non-finite values (NaN in '{TENSOR}')" in message
    assert "step-000001: model/model.safetensors holds non-finite values (inf in 'lm_head.weight')" in message
    assert "\n" not in message


def test_nan_optimizer_state_is_skipped_with_a_note(
    model_dir: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = copy_run(finished_run, tmp_path)
    ckpt = step_dir(out, 2)
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    first = min(saved["optimizer"]["state"])
    saved["optimizer"]["state"][first]["exp_avg_sq"].view(-1)[0] = float("nan")
    torch.save(saved, ckpt / "optimizer.pt")
    rewrite_manifest(ckpt, "optimizer.pt")
    resumed = resume(model_dir, out)
    try:
        assert resumed.resumed_from == 1
        [note] = resumed.resume_notes
        assert re.fullmatch(
            r"step-000002: optimizer\.pt holds non-finite values \(NaN in 'exp_avg_sq of lm\.[\w.]+'\)", note
        ), note
    finally:
        resumed.close()


def test_a_nan_learning_rate_in_the_optimizer_state_is_skipped(
    model_dir: Path, finished_run: Path, tmp_path: Path
) -> None:
    out = copy_run(finished_run, tmp_path)
    ckpt = step_dir(out, 2)
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    saved["optimizer"]["param_groups"][0]["lr"] = float("nan")
    torch.save(saved, ckpt / "optimizer.pt")
    rewrite_manifest(ckpt, "optimizer.pt")
    resumed = resume(model_dir, out)
    try:
        assert resumed.resumed_from == 1
        assert resumed.resume_notes == [
            "step-000002: optimizer.pt holds non-finite values (NaN in 'param_groups[0].lr')"
        ]
    finally:
        resumed.close()


def test_a_nan_value_head_is_skipped_with_a_note(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    gae = {"estimator": "gae"}
    trainer = Trainer(tiny_config(model_dir, out, algo=gae))
    try:
        trainer.run()
    finally:
        trainer.close()
    ckpt = step_dir(out, 2)
    head = torch.load(ckpt / "model" / "value_head.pt", weights_only=True)
    head["bias"][0] = float("inf")
    torch.save(head, ckpt / "model" / "value_head.pt")
    rewrite_manifest(ckpt, "model/value_head.pt")
    resumed = Trainer(tiny_config(model_dir, out, algo=gae, trainer={"steps": 3}), resume=True)
    try:
        assert resumed.resumed_from == 1
        assert resumed.resume_notes == [
            "step-000002: model/value_head.pt holds non-finite values (inf in 'bias')"
        ]
    finally:
        resumed.close()


def test_check_finite_names_the_first_bad_tensor_and_skips_integers() -> None:
    good = torch.ones(3)
    check_finite("f", [("a", good), ("ids", torch.arange(3)), ("lr", 0.1), ("flag", True), ("x", None)])
    bad = torch.ones(2, 2)
    bad[1, 1] = float("inf")
    nan = torch.zeros(4, dtype=torch.bfloat16)
    nan[2] = float("nan")
    with pytest.raises(NonFiniteWeights, match=r"^f holds non-finite values \(inf in 'b'\)$"):
        check_finite("f", [("a", good), ("b", bad), ("c", nan)])
    with pytest.raises(NonFiniteWeights, match=r"^w/c holds non-finite values \(NaN in 'c'\)$"):
        check_finite(lambda name: f"w/{name}", [("a", good), ("c", nan)])
    with pytest.raises(NonFiniteWeights, match=r"\(NaN in 'lr'\)"):
        check_finite("f", [("lr", float("nan"))])
    long = "x" * 10_000
    with pytest.raises(NonFiniteWeights) as caught:
        check_finite("f", [(long, bad)])
    assert len(str(caught.value)) < 200


def test_a_checkpoint_saved_with_nan_weights_is_still_recorded_and_never_resumed(
    model_dir: Path, finished_run: Path, tmp_path: Path
) -> None:
    """Saving NaN weights is kept (state.json says so); the loader never resumes from it either way."""
    out = copy_run(finished_run, tmp_path)
    trainer = resume(model_dir, out)
    try:
        with torch.no_grad():
            next(trainer.policy.parameters()).fill_(float("nan"))
        trainer.state.step = 3
        saved = trainer.save_checkpoint()
    finally:
        trainer.close()
    assert saved.state["finite"] is False and saved.step == 3
    resumed = resume(model_dir, out, steps=4)
    try:
        assert resumed.resumed_from == 2
        assert [n.split(":")[0] for n in resumed.resume_notes] == ["step-000003"]
        assert "not finite" in resumed.resume_notes[0]
    finally:
        resumed.close()
    # A state.json that claims finite weights does not fool the loader.
    state_file = step_dir(out, 3) / "state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "finite": True}))
    resumed = resume(model_dir, out, steps=4)
    try:
        assert resumed.resumed_from == 2
        [note] = resumed.resume_notes
        assert note == f"step-000003: {NON_FINITE} (NaN in 'model.embed_tokens.weight')"
    finally:
        resumed.close()

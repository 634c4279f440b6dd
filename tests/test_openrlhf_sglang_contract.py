"""SGLangRolloutEngine against OpenRLHF 0.11.2's own source (``pytest -m openrlhf``).

Which engine methods OpenRLHF calls is read from its installed source, not from a hand list: every
``<...engine...>.<method>.remote(``, ``batch_vllm_engine_call(engines, "<method>"`` and
``llm_engine.<method>(`` in the package. Each must exist on SGLangRolloutEngine and take the
arguments OpenRLHF's ``RolloutRayActor`` takes (read from its class with ``ast``);
``create_sglang_engines`` takes ``create_vllm_engines``' parameters in order; the learner patch
replaces OpenRLHF's sync-group set-up and engine factory.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.openrlhf
openrlhf = pytest.importorskip("openrlhf", reason="needs openrlhf")

from srt_agent.integrations.openrlhf.learner_patch import apply, sglang_sync_group  # noqa: E402
from srt_agent.integrations.openrlhf.sglang_engine import (  # noqa: E402
    SGLangRolloutEngine,
    create_sglang_engines,
)

ROOT = Path(openrlhf.__file__).parent
CALLS = (
    re.compile(r"\w*engine\w*\.(\w+)\.remote\("),
    re.compile(r"batch_vllm_engine_call\([^,]+,\s*\"(\w+)\""),
    re.compile(r"llm_engine\.(\w+)\("),
)


def _called() -> set[str]:
    found: set[str] = set()
    for path in ROOT.rglob("*.py"):
        text = path.read_text()
        for pattern in CALLS:
            found.update(pattern.findall(text))
    return found


def _functions(path: Path, owner: str | None) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text())
    body = tree.body
    if owner is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    return {n.name: n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs] if a.arg != "self"]


def test_every_engine_method_openrlhf_calls_exists_with_its_arguments() -> None:
    called = _called()
    assert {"generate_responses", "update_weight", "init_process_group", "wake_up"} <= called
    theirs = _functions(ROOT / "trainer" / "ray" / "vllm_engine.py", "RolloutRayActor")
    for name in sorted(called):
        ours = getattr(SGLangRolloutEngine, name, None)
        assert callable(ours), f"OpenRLHF calls {name} on its engines; SGLangRolloutEngine lacks it"
        accepted = inspect.signature(ours).parameters
        missing = [p for p in _params(theirs[name]) if p not in accepted]
        assert not missing, f"{name}: OpenRLHF's engine takes {missing}, ours does not"


def test_create_sglang_engines_takes_create_vllm_engines_parameters_in_order() -> None:
    theirs = _params(_functions(ROOT / "trainer" / "ray" / "vllm_engine.py", None)["create_vllm_engines"])
    ours = list(inspect.signature(create_sglang_engines).parameters)
    assert ours[: len(theirs)] == theirs


def test_the_patch_replaces_the_engine_factory() -> None:
    apply()
    import openrlhf.trainer.ray as ray_pkg

    assert ray_pkg.create_vllm_engines is create_sglang_engines
    source = (ROOT / "trainer" / "ray" / "ppo_actor.py").read_text()
    # What the learner patch relies on: OpenRLHF sets up the group in one method, and broadcasts
    # through the object it keeps as the group.
    assert "def _init_vllm_sync_group(self, backend: str):" in source
    assert "self._model_update_group.broadcast(param.data, src=0" in source


def test_the_patch_replaces_the_learners_sync_group() -> None:
    pytest.importorskip("deepspeed", reason="the learner's module imports deepspeed")
    apply()
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer

    assert ActorPPOTrainer._init_vllm_sync_group is sglang_sync_group

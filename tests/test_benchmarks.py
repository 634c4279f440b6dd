"""Every script in ``benchmarks/`` runs, on a tiny setting, and writes its JSON (CI's benchmark tier).

Benchmarks are not imported by the package, so nothing else notices when one of them stops
matching the code it measures. Each runs here as a user would (a subprocess from the repository
root) with settings small enough for seconds: the figures are not checked, only that the script
finishes, and that its ``--json`` file is one flat object. A new file in ``benchmarks/`` fails
:func:`test_every_benchmark_has_a_smoke_run` until it gets an entry below.

Run: ``pytest -m benchmarks tests/test_benchmarks.py`` (excluded from the default tier).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chat_fixtures import save_tiny_llama

pytestmark = pytest.mark.benchmarks

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

# Per script: its arguments, {model}, {trace} and {out} filled in; the JSON it writes is {out}/<name>.json.
SMOKE: dict[str, str] = {
    "draft_ceiling.py": "{trace} --model {model} --episodes 2",
    "draft_replay.py": "{trace} --repeat 1 --mode-bound {model}",
    "gradient_snr.py": "configs/quickstart.yaml model.dir={model} rollout.prompts_per_step=2 rollout.n=2 "
    "rollout.max_new_tokens=16 --batches 3",
    "native_micro.py": "--rows 4 --repeats 1",
    "ray_replicas.py": "--model {model} --prompts 1 --samples 2 --rounds 2",
    "env_isolation.py": "--steps 20",
    "first_departure.py": "--trace {trace} --model {model}",
    "soak.py": "--model {model} --episodes 40 --report-every 20 --concurrency 8 --fault-rate 0.3",
    "serve_load.py": "--model {model} --clients 1 4 --seconds 1",
    "sglang_corpus.py": "--requests 4 --steps 5",
    "spec_engine_micro.py": (
        "--batch-sizes 1 --new-tokens 8 --repeats 1 --model {model} --profile {out}/profile"
    ),
    "tree_cache_micro.py": "--states 4 --group 2 --length 160 --reps 20 --rows 4",
    "turn_probe.py": "--model {model} --env srt/RetailCopy-v0 --episodes 2 --threads 1",
}
# gpu_check.sh is run by test_gpu_check_runs_dry_on_a_cpu; gpu_wheels.sh only downloads wheels from
# PyPI for an offline GPU machine (run by hand before a device run; nothing here to measure).
SHELL = {"gpu_check.sh", "gpu_wheels.sh"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model and an eval trace of it (what the trace-reading benchmarks read)."""
    base = tmp_path_factory.mktemp("bench")
    model = save_tiny_llama(base / "model")
    trace = base / "trace.jsonl"
    _run(
        [sys.executable, "-m", "srt_agent.cli", "eval", "--env", "srt/Calculator-v0", "--model", str(model),
         "--episodes", "4", "--max-new-tokens", "16", "--no-spec", "--trace", str(trace)],
    )  # fmt: skip
    return {"model": model, "trace": trace, "out": base}


def _run(cmd: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ, **(env or {})}
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{output[-3000:]}"
    return output


def test_every_benchmark_has_a_smoke_run() -> None:
    on_disk = {p.name for p in BENCHMARKS.iterdir() if p.suffix in (".py", ".sh")}
    assert on_disk == set(SMOKE) | SHELL, f"add a smoke entry for {sorted(on_disk - set(SMOKE) - SHELL)}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs_on_a_tiny_setting(script: str, setup: dict[str, Path]) -> None:
    out = setup["out"] / f"{Path(script).stem}.json"
    args = [a.format(**{k: str(v) for k, v in setup.items()}) for a in SMOKE[script].split()]
    _run([sys.executable, str(BENCHMARKS / script), *args, "--json", str(out)])
    record = json.loads(out.read_text())
    assert isinstance(record, dict) and record, record
    nested = {k: type(v).__name__ for k, v in record.items() if isinstance(v, dict | list)}
    assert not nested, f"{script}: --json must be one flat object; nested: {nested}"


@pytest.mark.timeout(300)
def test_gpu_check_runs_dry_on_a_cpu(setup: dict[str, Path]) -> None:
    """The GPU script's orchestration, on the CPU with one cheap stage (its documented dry run)."""
    out = setup["out"] / "gpu-check"
    env = {"DEVICE": "cpu", "MODEL": str(setup["model"]), "SHAPE": "embedded", "STAGES": "micro"}
    env["NATIVE_BUILD"] = "0"  # the installed core is importable; compiling again takes a minute
    _run(["bash", str(BENCHMARKS / "gpu_check.sh"), str(out), "120"], env=env)
    log = (out / "log.txt").read_text()
    assert "=== micro: rc=0" in log, log[-3000:]
    assert json.loads((out / "micro.json").read_text())


def test_turn_probe_counts_each_id_by_its_first_token_and_by_all_of_them() -> None:
    """The id count of ``turn_probe.py``: grouped by the word before, right only if every token is."""
    spec = importlib.util.spec_from_file_location("turn_probe", BENCHMARKS / "turn_probe.py")
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    counts = probe.Counts()
    # "Mat (item 2309139583) for ... (item 8605668887)": the first id's first token wrong, the
    # second's last token wrong; a price and a short number are not ids.
    pieces = [
        " Mat",
        " (",
        "item",
        " ",
        "230",
        "913",
        "958",
        "3",
        ")",
        " $",
        "26",
        ".",
        "89",
        " (",
        "item",
        " ",
    ]
    pieces += ["860", "566", "888", "7", ")"]
    right = [True] * len(pieces)
    right[4] = False  # "230"
    right[19] = False  # the second id's "7"
    probe.count_ids(counts, "text", pieces, right)
    assert counts.ids_seen == {"text/item": 2}
    assert counts.ids_first_right == {"text/item": 1} and counts.ids_right == {"text/item": 0}
    probe.count_ids(counts, "get_product_details", ['{"product_id": "', "218", "454", "23", '"}'], [True] * 5)
    assert counts.ids_seen["get_product_details/value"] == counts.ids_right["get_product_details/value"] == 1

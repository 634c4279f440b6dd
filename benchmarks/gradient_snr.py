"""How much of one RL batch's policy gradient is signal: gradients of independent batches compared.

Run: ``python benchmarks/gradient_snr.py [configs/quickstart.yaml] [key=value ...] [--batches 8]
[--json snr.json]`` (needs the run's model, e.g. ``srt-agent build-model``; about a minute for the
quickstart on 2 cores).

It rolls out ``--batches`` independent training batches (the steps 1, 2, ... of the config's task
draw) with the starting policy, and takes each batch's loss gradient exactly as one optimizer
update would (before clipping), without updating. With ``g_i = mu + n_i`` (``mu`` the expected
gradient, ``n_i`` the batch's noise), the mean of ``g_i . g_j`` over pairs ``i != j`` estimates
``|mu|^2`` and the mean of ``|g_i|^2`` estimates ``|mu|^2 + E|n|^2``, so:

* ``signal_fraction`` = ``|mu|^2 / E|g|^2``: the share of one batch's gradient energy that is signal.
* ``episodes_for_snr1`` = ``episodes per batch * E|n|^2 / |mu|^2``: how many episodes one gradient
  must average before its signal is as large as its noise (McCandlish et al., 2018, call this the
  noise scale; updates on much smaller batches mostly random-walk).
* ``mean_cosine``: the mean cosine between two batches' gradients.
* ``signal_fraction_stderr``: its jackknife standard error over batches. With a small signal the
  estimate is noisy (it can come out negative): use more ``--batches`` to tighten it.

JSON keys (``--json``): ``batches``, ``episodes_per_batch``, and ``{all,embeddings,body}_`` followed by
``signal_fraction``, ``signal_fraction_stderr``, ``episodes_for_snr1``, ``mean_cosine``.

Rows are also split into the token embeddings (tied with the LM head here) and the transformer body.
"""

from __future__ import annotations

import argparse
import itertools
import math
import tempfile
from pathlib import Path

import torch

from srt_agent.config import load_config
from srt_agent.output.records import write_record
from srt_agent.train.tasks import step_episodes
from srt_agent.train.trainer import Trainer, trainable_episodes


def _energies(g: torch.Tensor) -> tuple[float, float]:
    """``(|mu|^2, E|g|^2)`` estimated from the rows of ``g`` (one batch's gradient each)."""
    pairs = list(itertools.combinations(range(len(g)), 2))
    mu2 = sum(float(g[i] @ g[j]) for i, j in pairs) / len(pairs)
    return mu2, float((g * g).sum(dim=1).mean())


def _signal_fraction(g: torch.Tensor) -> float:
    mu2, total = _energies(g)
    return mu2 / total if total > 0 else 0.0


def _stats(grads: list[torch.Tensor], episodes: float) -> dict[str, float]:
    g = torch.stack(grads).double()
    k = len(grads)
    # Jackknife over batches: the estimate is noisy when the signal is small (it can even come out
    # negative), so say how noisy.
    loo = [_signal_fraction(torch.cat([g[:i], g[i + 1 :]])) for i in range(k)]
    mean_loo = sum(loo) / k
    stderr = math.sqrt((k - 1) / k * sum((x - mean_loo) ** 2 for x in loo))
    mu2, total = _energies(g)
    pairs = itertools.combinations(range(k), 2)
    cosines = [float(torch.nn.functional.cosine_similarity(g[i], g[j], dim=0)) for i, j in pairs]
    noise = max(total - mu2, 0.0)
    return {
        "signal_fraction": _signal_fraction(g),
        "signal_fraction_stderr": stderr,
        "episodes_for_snr1": episodes * noise / mu2 if mu2 > 0 else float("inf"),
        "mean_cosine": sum(cosines) / len(cosines),
    }


def main() -> None:
    """Parse arguments, measure, print the table, write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "args", nargs="*", help="YAML files (default: configs/quickstart.yaml), then key=value overrides"
    )
    parser.add_argument("--batches", type=int, default=8, help="independent batches (>= 3)")
    parser.add_argument("--json", type=Path, default=None, help="write the headline figures here")
    args = parser.parse_args()
    if args.batches < 3:
        parser.error(f"--batches must be >= 3 (pairs of batches estimate the signal), got {args.batches}")
    files = [a for a in args.args if "=" not in a] or ["configs/quickstart.yaml"]
    overrides = [a for a in args.args if "=" in a]
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(files, [*overrides, f"trainer.out_dir={out}", "spec.run_ahead=false"])
        trainer = Trainer(cfg)
        try:
            parts: dict[str, list[torch.Tensor]] = {"all": [], "embeddings": [], "body": []}
            rewards, episodes = [], []
            for step in range(1, args.batches + 1):
                batch = trainer.rollouts.rollout(step_episodes(cfg, step))
                trained = trainable_episodes(batch.trajectories)
                prep = trainer.learner.prepare(trained)
                trainer.learner.backward(prep, range(len(trained)))
                flat = trainer.learner.gradients()
                parts["all"].append(torch.cat(list(flat.values())))
                parts["embeddings"].append(torch.cat([v for n, v in flat.items() if "embed" in n]))
                parts["body"].append(torch.cat([v for n, v in flat.items() if "embed" not in n]))
                rewards.append(sum(x.total_reward for x in batch.trajectories) / len(batch.trajectories))
                episodes.append(len(trained))
                print(f"batch {step}: {len(trained)} episodes, mean reward {rewards[-1]:.3f}", flush=True)
        finally:
            trainer.close()
    per_batch = sum(episodes) / len(episodes)
    result: dict[str, float] = {"batches": float(args.batches), "episodes_per_batch": per_batch}
    print("\n| Parameters | Signal fraction (± s.e.) | Episodes for SNR 1 | Mean cosine |")
    print("|---|---|---|---|")
    for name, grads in parts.items():
        s = _stats(grads, per_batch)
        fraction = f"{s['signal_fraction']:.4f} ± {s['signal_fraction_stderr']:.4f}"
        figures = f"{fraction} | {s['episodes_for_snr1']:.0f} | {s['mean_cosine']:.4f}"
        print(f"| {name} | {figures} |")
        result.update({f"{name}_{k}": v for k, v in s.items()})
    if args.json is not None:
        write_record(args.json, result)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

"""``srt-agent bench engine`` and ``bench rollout``: measurements side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srt_agent.cli.app import (
    SPEC_FILE_HELP,
    app,
    check_output_paths,
    console,
    exit_with,
    pick_model_dir,
    spec_options,
)

bench_app = typer.Typer(
    help="Benchmarks (each prints a table and accepts --json PATH).", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")


@bench_app.command("engine")
def bench_engine_cmd(
    model: Annotated[Path | None, typer.Option(help="HF model dir [default: the embedded model].")] = None,
    shape: Annotated[
        str | None,
        typer.Option(help="Benchmark a random model of this shape instead: embedded or qwen2.5-0.5b."),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda (bfloat16 and CUDA graphs on a GPU).")] = "cpu",
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,32",
    new_tokens: Annotated[int, typer.Option(min=2, help="Tokens generated per sequence.")] = 128,
    hf: Annotated[bool, typer.Option(help="Also time HF generate() (the speedup's reference).")] = True,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the figures as JSON here.")] = None,
) -> None:
    """Decode tokens/s of TorchEngine vs HF generate() (and, on a GPU, vs itself without CUDA graphs)."""
    from srt_agent.speed.engine_speed import bench_engine
    from srt_agent.speed.random_model import SHAPES

    if shape is not None and shape not in SHAPES:
        raise exit_with(f"unknown --shape {shape!r}; choose from {', '.join(SHAPES)}")
    try:
        sizes = tuple(int(b) for b in batch_sizes.split(","))
    except ValueError:
        raise exit_with(
            ValueError(f"--batch-sizes must be integers like 1,32, got {batch_sizes!r}")
        ) from None
    from srt_agent.devices import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise exit_with(exc) from None
    model_dir = None if shape is not None else pick_model_dir(model)
    check_output_paths((json_path, "--json"))
    bench_engine(
        model_dir,
        json_path,
        device=device,
        shape=shape or "embedded",
        batch_sizes=sizes,
        new_tokens=new_tokens,
        hf=hf,
    )


@bench_app.command("rollout")
def bench_rollout_cmd(
    model: Annotated[Path | None, typer.Option(help="HF model dir (default: the embedded model).")] = None,
    env: Annotated[list[str] | None, typer.Option(help="Env id (repeatable).")] = None,
    prompts: Annotated[int, typer.Option(min=1, help="Tasks per env.")] = 8,
    samples: Annotated[int, typer.Option(min=1, help="Samples per task.")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Rollout rounds over the same prompts.")] = 5,
    hf_rounds: Annotated[int, typer.Option(min=1, help="Rounds the (slow) HF peers run.")] = 1,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per turn.")] = 128,
    max_turns: Annotated[int, typer.Option(min=1, help="Env turn limit.")] = 8,
    threads: Annotated[int, typer.Option(min=1, help="Torch threads.")] = 1,
    configs: Annotated[
        str | None, typer.Option(help="Comma-separated configurations (default: all).")
    ] = None,
    backoff_window: Annotated[
        int | None,
        typer.Option(
            min=0, help="Tree cache suffix back-off (spec.cache.backoff_window; 0: off) [default: 0]."
        ),
    ] = None,
    draws: Annotated[
        str | None,
        typer.Option(help="How verify steps draw (spec.draws): auto, walk or all [default: auto]."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help=SPEC_FILE_HELP + " The speculating configurations use it."),
    ] = None,
    device: Annotated[str, typer.Option(help="Torch device of every engine: cpu or cuda.")] = "cpu",
    dtype: Annotated[
        str, typer.Option(help="TorchEngine dtype: auto (bfloat16 on a GPU), float32 or bfloat16.")
    ] = "auto",
    batch: Annotated[int, typer.Option(min=1, help="Engine batch (max concurrent episodes).")] = 32,
    url: Annotated[str | None, typer.Option(help="Also roll out through this server (`server`).")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the headline figures here.")] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="After the timed rounds, one untimed round of off and srt under torch.profiler: "
            "tables in DIR/off.txt, DIR/srt.txt."
        ),
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = Path(
        "runs/bench_rollout.png"
    ),
) -> None:
    """Multi-round rollouts with SRT off/on, without run-ahead, random drafts, HF peers, slow tools."""
    from srt_agent.speed.rollout_report import bench_rollout
    from srt_agent.speed.rollout_speed import CONFIGS, RolloutBenchConfig

    model_dir = pick_model_dir(model)
    options = spec_options(config)
    try:
        bench = RolloutBenchConfig(
            model_dir, prompts=prompts, samples=samples, rounds=rounds, hf_rounds=hf_rounds,
            max_new_tokens=max_new_tokens, max_turns=max_turns, threads=threads,
            envs=tuple(env) if env else RolloutBenchConfig.envs,
            configs=tuple(c.strip() for c in configs.split(",")) if configs else CONFIGS,
            backoff_window=backoff_window, draws=draws, device=device, dtype=dtype,
            max_batch_size=batch, server_url=url, spec_options=options, profile_dir=profile,
        )  # fmt: skip
    except ValueError as exc:
        raise exit_with(exc) from None
    check_output_paths((json_path, "--json"), (plot, "--plot"))
    bench_rollout(bench, json_path=json_path, plot_path=plot, console=console)

"""``srt-agent build-model``, ``eval`` and ``train``: a model built, scored and trained."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from srt_agent.cli.app import (
    ENV_OPTION_HELP,
    SPEC_FILE_HELP,
    app,
    check_output_paths,
    console,
    exit_with,
    parse_env_options,
    pick_model_dir,
    spec_options,
)
from srt_agent.env.registration import (
    UnknownEnvError,
    require_oracle,
    validate_env_options,
)
from srt_agent.output.paths import default_model_dir
from srt_agent.output.records import build_record
from srt_agent.output.reporting import write_json


@app.command("build-model")
def build_model_cmd(
    out: Annotated[
        Path | None, typer.Option(help="Output dir [default: $SRT_AGENT_MODEL or runs/embedded-model].")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seeds demos, weights and data order (same seed, same model).")
    ] = 0,
    force: Annotated[
        bool, typer.Option("--force", help="Write into a non-empty dir that holds no build.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the build figures as JSON here.")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            help="Where SFT runs: cpu (deterministic per seed and threads) or cuda [default: the preset's: "
            "cuda for gpu, else cpu]."
        ),
    ] = None,
    preset: Annotated[
        str,
        typer.Option(
            help="embedded (the default model), tool-choice (Calculator warm start mixed with tool-free "
            "demonstrations: the RL quickstart's model), retail (Retail's conversations after a copying "
            "drill, then a finishing stage on long conversations: ~12 minutes on 2 cores from the "
            "shipped retail-base build, ~40 without it; configs/retail.yaml copies its shipped seed-2 "
            "build), retail-base (retail before its finishing stage), "
            "reasoning-gym (the same lesson on reasoning-gym's basic_arithmetic; needs the reasoning-gym "
            "extra), gpu (the tool-choice lesson at ~87M parameters, built on a CUDA GPU in ~2 minutes), "
            "retail-gpu or gpu-0.5b (Retail at the gpu preset's size, finished on long conversations; "
            "Qwen2.5-0.5B's shape)."
        ),
    ] = "embedded",
) -> None:
    """Build a model (the embedded one, or a preset): tokenizer, small Llama, SFT on demonstrations."""
    from dataclasses import replace

    from srt_agent.env.registration import UnknownEnvError
    from srt_agent.recipe.build import BuildDirError, build_model, preset_config

    target = out or default_model_dir()
    check_output_paths((json_path, "--json"))
    try:
        defaults = preset_config(preset)
        config = replace(defaults, sft=replace(defaults.sft, device=device or defaults.sft.device))
        report = build_model(target, seed=seed, force=force, config=config)
    except (BuildDirError, UnknownEnvError, ValueError) as exc:
        raise exit_with(exc) from None
    table = Table(title=f"{preset} model -> {target}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    record = build_record(report)
    for key, value in record.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    write_json(console, json_path, record)


@app.command("eval")
def eval_cmd(
    env: Annotated[str, typer.Option("--env", help="Registered env id, e.g. srt/Calculator-v0.")],
    model: Annotated[Path | None, typer.Option(help="HF model dir [default: the embedded model].")] = None,
    episodes: Annotated[
        int, typer.Option(min=1, help="Tasks (env seeds first_seed, first_seed+1, ...).")
    ] = 16,
    k: Annotated[int, typer.Option(min=1, help="Trials per task (pass^k).")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature (0 = greedy).")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Most tokens per assistant turn.")] = 512,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Cap on assistant turns per episode.")] = None,
    seed: Annotated[int, typer.Option(help="Base sampling seed.")] = 0,
    first_seed: Annotated[int, typer.Option(help="Env seed of the first task.")] = 0,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the flat report as JSON here.")
    ] = None,
    trace: Annotated[Path | None, typer.Option(help="Write a JSONL trace of every turn here.")] = None,
    spec: Annotated[
        bool, typer.Option("--spec/--no-spec", help="Speculate from a tree cache of the run's turns (SRT).")
    ] = True,
    engine: Annotated[
        str, typer.Option(help="torch (in-process) or sglang (a server at --url; it drafts itself).")
    ] = "torch",
    url: Annotated[str | None, typer.Option(help="The server of --engine sglang.")] = None,
    replicas: Annotated[int, typer.Option(min=0, help="Engine replicas on Ray (0: in this process).")] = 0,
    device: Annotated[str, typer.Option(help="Where the in-process engine runs: cpu, cuda or auto.")] = "cpu",
    config: Annotated[
        Path | None,
        typer.Option("--config", help=SPEC_FILE_HELP),
    ] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help=ENV_OPTION_HELP)] = None,
    isolation: Annotated[
        str | None,
        typer.Option(
            help="Where env code runs: thread (this process) or process (worker processes: an env that "
            "crashes, exits or hangs fails its episode only) [default: the env's registered choice]."
        ),
    ] = None,
    max_failed: Annotated[
        float,
        typer.Option(min=0.0, max=1.0, help="Exit 1 when more than this share of episodes failed."),
    ] = 0.1,
    constrain_tool_calls: Annotated[
        bool,
        typer.Option(
            "--constrain-tool-calls",
            help="Decode each <tool_call> block under the grammar of the env's tools: every call names a "
            "tool and its parameters, with values of their types (in-process engine only).",
        ),
    ] = False,
    copy_tool_arguments: Annotated[
        bool,
        typer.Option(
            "--copy-tool-arguments",
            help="With --constrain-tool-calls: each string argument is a word or quoted string of the "
            "conversation so far (ids, names, e-mails copied, never invented).",
        ),
    ] = False,
    oracle_prefix: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Start each episode after the env's oracle has played this share of its solution (0-1): "
            "success from part-way through a task shows where a model breaks down.",
        ),
    ] = None,
) -> None:
    """Score a model on an env: success rate, pass^k, turns, tokens, tool calls, tokens/s."""
    from srt_agent.evaluation import eval_command
    from srt_agent.serving.engine_config import EngineConfig

    try:
        env_options = parse_env_options(option)
        # Before the model is looked for: a typo should be the first thing said.
        validate_env_options(env, env_options)
        if oracle_prefix is not None:
            require_oracle(env, "--oracle-prefix")
        engine_config = EngineConfig(kind=engine, url=url)  # type: ignore[arg-type]
        if isolation not in (None, "thread", "process"):
            raise ValueError(f"--isolation {isolation!r}: use thread or process")
    except (UnknownEnvError, ValueError) as exc:
        raise exit_with(exc) from None
    model_dir = pick_model_dir(model)
    ray = None
    if replicas:
        from srt_agent.distributed.ray_config import RayConfig

        ray = RayConfig(replicas=replicas)
    code = eval_command(
        env,
        model_dir,
        episodes=episodes,
        k=k,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        json_path=json_path,
        trace_path=trace,
        console=console,
        seed=seed,
        first_seed=first_seed,
        speculate=spec,
        engine=engine_config,
        device=device,
        spec_options=spec_options(config),
        ray=ray,
        max_turns=max_turns,
        env_options=env_options or None,
        isolation=isolation,  # type: ignore[arg-type]  # checked above: thread, process or None
        max_failed=max_failed,
        constrain_tool_calls=constrain_tool_calls,
        copy_tool_arguments=copy_tool_arguments,
        oracle_prefix=oracle_prefix,
    )
    if code:
        raise typer.Exit(code)


@app.command("train")
def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML run config, e.g. configs/quickstart.yaml.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted.key=value overrides, e.g. trainer.steps=5.")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the newest checkpoint in trainer.out_dir.")
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the run summary as JSON here.")
    ] = None,
) -> None:
    """Train a policy with multi-turn RL and SRT rollouts; evaluates before and after."""
    from srt_agent.train import train_command

    code = train_command(config, overrides or [], resume=resume, json_path=json_path, console=console)
    if code:
        raise typer.Exit(code)

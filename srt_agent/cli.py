"""The ``srt-agent`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import gymnasium as gym
import typer
from rich.table import Table

from srt_agent import __version__
from srt_agent.env.demo import oracle_table
from srt_agent.env.multi_turn import EnvConfigError, MultiTurnEnv
from srt_agent.env.play import play as play_episode
from srt_agent.env.registration import (
    UnknownEnvError,
    check_env_id,
    make,
    registered_envs,
    validate_env_options,
)
from srt_agent.output.console import make_console
from srt_agent.output.paths import OutputPathError, default_model_dir, resolve_model_dir
from srt_agent.output.records import build_record
from srt_agent.output.reporting import check_outputs, print_error, write_json

if TYPE_CHECKING:
    from srt_agent.config.sections import SpecSection

app = typer.Typer(
    name="srt-agent",
    help="Multi-turn RL for tool-using LLM agents with speculative rollouts from a tree cache (SRT).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = make_console()
err_console = make_console(stderr=True)

SPEC_FILE_HELP = (
    "Speculation options (tree cache, draft budget, cost model, run-ahead): a run config, whose `spec` "
    "section is used, or a `spec` or `spec.cache` section on its own (YAML or JSON)."
)


def _version(value: bool) -> None:
    if value:
        console.print(f"srt-agent {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """srt-agent command line."""


def _make(env_id: str, **options: Any) -> gym.Env[tuple[Any, ...], str]:
    """Make an env, turning bad ids and options into a clean exit with the message (exit code 2)."""
    try:
        return make(env_id, **options)
    except (UnknownEnvError, EnvConfigError) as exc:
        raise _report_error(exc) from None


ENV_OPTION_HELP = (
    "An env option as KEY=VALUE (repeatable; VALUE is read as YAML: 3, true, [a, b], {k: v}), "
    "e.g. -o tool=calculator. `srt-agent envs` lists each env's options."
)


def _env_options(pairs: list[str] | None) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as env options, each value read as YAML.

    Read the way a run config's overrides are (the same guarded reader: ``1e-4`` is a float,
    alias bombs are refused), so ``-o`` and ``env.options`` agree.

    Raises:
        ValueError: A pair without ``=``, or a value that is not YAML.
    """
    from srt_agent.config.loader import ConfigError, apply_overrides

    for pair in pairs or []:
        key, sep, _ = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--option {pair!r}: write KEY=VALUE, e.g. --option max_turns=4")
    try:
        return apply_overrides({}, pairs or [])
    except ConfigError as exc:
        raise ValueError("--option: " + "; ".join(exc.problems)) from None


@app.command("envs")
def envs_cmd() -> None:
    """List the registered multi-turn envs with their tools and options."""
    table = Table(title="Registered multi-turn environments")
    table.add_column("id", no_wrap=True)
    table.add_column("tools", no_wrap=True)
    table.add_column("max turns", justify="right")
    table.add_column("description")
    for env_id in registered_envs():
        env = gym.make(env_id).unwrapped
        assert isinstance(env, MultiTurnEnv)
        doc = (type(env).__doc__ or "").strip()
        table.add_row(
            env_id, "\n".join(env.tools.names) or "-", str(env.config.max_turns), doc.split("\n")[0]
        )
        env.close()
    console.print(table)
    console.print(_ecosystems_table())


def _ecosystems_table() -> Table:
    """The ecosystems whose envs run through a prefix, and whether their package is installed."""
    from srt_agent.integrations.ecosystems import ECOSYSTEMS

    table = Table(title="Environments from other ecosystems (name them PREFIX:NAME)")
    table.add_column("prefix", no_wrap=True)
    table.add_column("package")
    table.add_column("example id", no_wrap=True)
    for eco in ECOSYSTEMS.values():
        version = eco.installed_version()
        state = (
            f"{eco.package} {version}" if version else f"not installed: pip install 'srt-agent[{eco.extra}]'"
        )
        table.add_row(f"{eco.prefix}:", state, eco.example)
    return table


@app.command("play")
def play_cmd(
    env_id: Annotated[str, typer.Argument(help="Registered env id, e.g. srt/Retail-v0.")],
    seed: Annotated[int | None, typer.Option(help="Seed for reset (same seed, same task).")] = None,
    oracle: Annotated[bool, typer.Option("--oracle", help="Let the scripted oracle play.")] = False,
    max_turns: Annotated[int | None, typer.Option(help="Override the env's turn limit.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", "-o", help=ENV_OPTION_HELP)] = None,
) -> None:
    """Play one episode: you type the assistant's turns (tool calls run for real), or --oracle plays."""
    try:
        options = _env_options(option)
    except ValueError as exc:
        raise _report_error(exc) from None
    if max_turns is not None:
        options["max_turns"] = max_turns
    env = _make(env_id, **options)
    try:
        play_episode(env, seed=seed, oracle=oracle, console=console)
    except NotImplementedError as exc:
        raise _report_error(f"{exc}; play it yourself without --oracle") from None
    finally:
        env.close()


@app.command("demo")
def demo_cmd(
    seed: Annotated[int, typer.Option(help="Seed of the first episode (then seed+1, ...).")] = 0,
    episodes: Annotated[int, typer.Option(min=1, help="Oracle episodes per env.")] = 1,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write the summary as JSON here.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not print transcripts.")] = False,
) -> None:
    """List the envs, then let each env's oracle play episodes and summarise the results."""
    _check_outputs((json_path, "--json"))
    envs_cmd()
    table, record, ok = oracle_table(registered_envs(), seed, episodes, console=console, quiet=quiet)
    console.print(table)
    write_json(console, json_path, record)
    if not ok:
        err_console.print("[red]an oracle failed to solve every task[/red]")
        raise typer.Exit(1)


def _spec_options(config: Path | None, *, server: bool = False) -> SpecSection:
    """The ``spec`` section of ``--config`` (the defaults without one), or exit 2 saying why.

    ``server``: for a server's options (see :func:`srt_agent.config.spec_file.load_spec`).
    """
    from srt_agent.config.loader import ConfigError
    from srt_agent.config.spec_file import load_spec

    try:
        return load_spec(config, server=server)
    except ConfigError as exc:
        raise _report_error(exc) from None


def _report_error(error: Exception | str) -> typer.Exit:
    """Print the error (see :func:`~srt_agent.output.reporting.print_error`); raise what it returns."""
    return typer.Exit(print_error(err_console, error))


def _check_outputs(*outputs: tuple[Path | None, str]) -> None:
    """Check, before a run, that each given output path can be written, or exit saying why (code 2).

    After the run it would be too late: the results would be lost.
    """
    try:
        check_outputs(*outputs)
    except OutputPathError as exc:
        raise _report_error(exc) from None


def _model_dir(model: Path | None) -> Path:
    """The model to use (see :func:`srt_agent.output.paths.resolve_model_dir`), or a clean exit saying why."""
    try:
        path, note = resolve_model_dir(model)
    except FileNotFoundError as exc:
        raise _report_error(exc) from None
    if note:
        err_console.print(f"[dim]{note}[/dim]")
    return path


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
            "demonstrations: the RL quickstart's model), reasoning-gym (the same lesson on reasoning-gym's "
            "basic_arithmetic; needs the reasoning-gym extra) or gpu (the tool-choice lesson at ~87M "
            "parameters, built on a CUDA GPU in ~2 minutes)."
        ),
    ] = "embedded",
) -> None:
    """Build a model (the embedded one, or a preset): tokenizer, small Llama, SFT on demonstrations."""
    from dataclasses import replace

    from srt_agent.env.registration import UnknownEnvError
    from srt_agent.recipe.build import BuildDirError, build_model, preset_config

    target = out or default_model_dir()
    _check_outputs((json_path, "--json"))
    try:
        defaults = preset_config(preset)
        config = replace(defaults, sft=replace(defaults.sft, device=device or defaults.sft.device))
        report = build_model(target, seed=seed, force=force, config=config)
    except (BuildDirError, UnknownEnvError, ValueError) as exc:
        raise _report_error(exc) from None
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
) -> None:
    """Score a model on an env: success rate, pass^k, turns, tokens, tool calls, tokens/s."""
    from srt_agent.evaluation import eval_command
    from srt_agent.serving.engine_config import EngineConfig

    try:
        env_options = _env_options(option)
        # Before the model is looked for: a typo should be the first thing said.
        validate_env_options(env, env_options)
        engine_config = EngineConfig(kind=engine, url=url)  # type: ignore[arg-type]
    except (UnknownEnvError, ValueError) as exc:
        raise _report_error(exc) from None
    model_dir = _model_dir(model)
    options: dict[str, Any] = {
        "seed": seed,
        "first_seed": first_seed,
        "speculate": spec,
        "engine": engine_config,
        "device": device,
        "spec_options": _spec_options(config),
    }
    if replicas:
        from srt_agent.distributed.ray_config import RayConfig

        options["ray"] = RayConfig(replicas=replicas)
    if max_turns is not None:
        options["max_turns"] = max_turns
    if env_options:
        options["env_options"] = env_options
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
        **options,
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


@app.command("serve")
def serve_cmd(
    model: Annotated[Path | None, typer.Option(help="HF model dir [default: the embedded model].")] = None,
    host: Annotated[str, typer.Option(help="Interface (the API has no authentication).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one).")] = 30000,
    spec: Annotated[bool, typer.Option("--spec/--no-spec", help="Draft from a tree cache (SRT).")] = True,
    max_batch: Annotated[int, typer.Option(min=1, help="Sequences decoding at once.")] = 32,
    device: Annotated[str, typer.Option(help="cpu, cuda or auto.")] = "cpu",
    seed: Annotated[int | None, typer.Option(help="Seed for requests without sampling_seed.")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="Torch CPU threads.")] = None,
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body, in MiB.")] = 16.0,
    max_connections: Annotated[
        int, typer.Option(min=1, help="Connections open at once (requests on more get 503).")
    ] = 1024,
    request_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may take to arrive whole (then 408).")
    ] = 30.0,
    config: Annotated[
        Path | None,
        typer.Option("--config", help=SPEC_FILE_HELP),
    ] = None,
) -> None:
    """Serve the embedded engine over SGLang's native HTTP API (POST /generate, weight updates)."""
    from srt_agent.serving.commands import serve

    options = _spec_options(config, server=True)
    model_dir = _model_dir(model)
    try:
        serve(model_dir, host=host, port=port, spec=spec, max_batch=max_batch, device=device,
              seed=seed, threads=threads, console=console, cache=options.cache,
              spec_config=options.engine_config(), max_body_bytes=int(max_body_mb * 2**20),
              max_connections=max_connections, request_timeout_s=request_timeout)  # fmt: skip
    except (OSError, ValueError) as exc:  # port taken, bad device, unloadable model
        raise _report_error(exc) from None


@app.command("sglang-serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sglang_serve_cmd(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="HF model dir or hub id, as SGLang's --model-path.")],
    host: Annotated[str, typer.Option(help="Interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port.")] = 30000,
    draft_tokens: Annotated[
        int | None,
        typer.Option(
            help="Tree slots per request, root included [default: spec.max_draft_tokens + 1, or 12]."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help=SPEC_FILE_HELP),
    ] = None,
) -> None:
    """Start SGLang's server with SRT drafting inside it; other flags go to SGLang unchanged."""
    from srt_agent.config.spec_file import sglang_draft_slots, sglang_refusals
    from srt_agent.integrations.sglang.launch import launch

    options = _spec_options(config, server=True)
    refused = sglang_refusals(options, draft_tokens if config is not None else None)
    if refused:
        raise _report_error("; ".join(refused))
    if draft_tokens is None:
        draft_tokens = sglang_draft_slots(options if config is not None else None)
    try:
        launch(model, host=host, port=port, draft_tokens=draft_tokens, extra=ctx.args, spec_file=config)
    except (RuntimeError, ValueError) as exc:
        raise _report_error(exc) from None


@app.command("openrlhf-data")
def openrlhf_data_cmd(
    env: Annotated[str, typer.Option("--env", help="Registered env id, e.g. srt/Calculator-v0.")],
    out: Annotated[Path, typer.Option(help="The prompt dataset (JSONL) to write.")],
    tasks: Annotated[
        int, typer.Option(min=1, help="Tasks (env seeds first_seed, first_seed+1, ...).")
    ] = 1000,
    first_seed: Annotated[int, typer.Option(min=0, help="Env seed of the first task.")] = 1_000_000,
) -> None:
    """Write OpenRLHF's prompt dataset for an srt env (one line per task; see examples/openrlhf)."""
    from srt_agent.integrations.openrlhf.samples import write_prompts

    try:
        check_env_id(env)
    except UnknownEnvError as exc:
        raise _report_error(exc) from None
    _check_outputs((out, "--out"))
    write_prompts(out, env, range(first_seed, first_seed + tasks))
    console.print(f"wrote {tasks} prompts to {out}")


@app.command("openrlhf-train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def openrlhf_train_cmd(
    ctx: typer.Context,
    server: Annotated[
        str, typer.Option(help="Rollout servers: sglang (SGLang with SRT, GPUs) or srt (embedded engine).")
    ] = "sglang",
) -> None:
    """OpenRLHF's PPO/GRPO trainer with SGLang rollout engines drafting with SRT.

    Everything after `--` is OpenRLHF's own arguments (openrlhf.cli.train_ppo_ray); see
    examples/openrlhf for GRPO on srt/Calculator-v0.
    """
    from srt_agent.integrations.openrlhf.learner_patch import OpenRLHFSetupError, run_openrlhf_train

    try:
        run_openrlhf_train(list(ctx.args), server=server)
    except OpenRLHFSetupError as exc:
        raise _report_error(exc) from None


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
        raise _report_error(f"unknown --shape {shape!r}; choose from {', '.join(SHAPES)}")
    try:
        sizes = tuple(int(b) for b in batch_sizes.split(","))
    except ValueError:
        raise _report_error(
            ValueError(f"--batch-sizes must be integers like 1,32, got {batch_sizes!r}")
        ) from None
    from srt_agent.devices import resolve_device

    try:
        resolve_device(device)
    except ValueError as exc:
        raise _report_error(exc) from None
    model_dir = None if shape is not None else _model_dir(model)
    _check_outputs((json_path, "--json"))
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
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here.")] = Path(
        "runs/bench_rollout.png"
    ),
) -> None:
    """Multi-round rollouts with SRT off/on, without run-ahead, random drafts, HF peers, slow tools."""
    from srt_agent.speed.rollout_report import bench_rollout
    from srt_agent.speed.rollout_speed import CONFIGS, RolloutBenchConfig

    model_dir = _model_dir(model)
    options = _spec_options(config)
    try:
        bench = RolloutBenchConfig(
            model_dir, prompts=prompts, samples=samples, rounds=rounds, hf_rounds=hf_rounds,
            max_new_tokens=max_new_tokens, max_turns=max_turns, threads=threads,
            envs=tuple(env) if env else RolloutBenchConfig.envs,
            configs=tuple(c.strip() for c in configs.split(",")) if configs else CONFIGS,
            backoff_window=backoff_window, draws=draws, device=device, dtype=dtype,
            max_batch_size=batch, server_url=url, spec_options=options,
        )  # fmt: skip
    except ValueError as exc:
        raise _report_error(exc) from None
    _check_outputs((json_path, "--json"), (plot, "--plot"))
    bench_rollout(bench, json_path=json_path, plot_path=plot, console=console)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # python -m srt_agent.cli (where the console script is not installed)
    main()

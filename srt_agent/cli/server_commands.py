"""``srt-agent serve``, ``sglang-serve``, ``openrlhf-data`` and ``openrlhf-train``: engines behind servers."""

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
from srt_agent.env.registration import (
    UnknownEnvError,
    check_env_id,
)


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

    options = spec_options(config, server=True)
    model_dir = pick_model_dir(model)
    try:
        serve(model_dir, host=host, port=port, spec=spec, max_batch=max_batch, device=device,
              seed=seed, threads=threads, console=console, cache=options.cache,
              spec_config=options, max_body_bytes=int(max_body_mb * 2**20),
              max_connections=max_connections, request_timeout_s=request_timeout)  # fmt: skip
    except (OSError, ValueError) as exc:  # port taken, bad device, unloadable model
        raise exit_with(exc) from None


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
    from srt_agent.integrations.sglang.launch import launch
    from srt_agent.integrations.sglang.refusals import sglang_draft_slots, sglang_refusals

    options = spec_options(config, server=True)
    refused = sglang_refusals(options, draft_tokens if config is not None else None)
    if refused:
        raise exit_with("; ".join(refused))
    if draft_tokens is None:
        draft_tokens = sglang_draft_slots(options if config is not None else None)
    try:
        launch(model, host=host, port=port, draft_tokens=draft_tokens, extra=ctx.args, spec_file=config)
    except (RuntimeError, ValueError) as exc:
        raise exit_with(exc) from None


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
        raise exit_with(exc) from None
    check_output_paths((out, "--out"))
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
        raise exit_with(exc) from None

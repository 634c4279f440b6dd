"""What ``srt-agent train CONFIG [overrides] [--resume] [--json PATH]`` runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from srt_agent.config import ConfigError, RunConfig, load_config
from srt_agent.env.multi_turn import EnvConfigError
from srt_agent.env.registration import UnknownEnvError, require_oracle, validate_env_options
from srt_agent.output.console import make_console
from srt_agent.output.paths import OutputPathError, check_output_dir
from srt_agent.output.records import write_record
from srt_agent.output.reporting import check_outputs, print_error, write_json
from srt_agent.train.checkpoint import latest_checkpoint
from srt_agent.train.plots import plot_run
from srt_agent.train.summary import SUMMARY_SCHEMA, summarize, summary_table
from srt_agent.train.train_progress import TrainProgress
from srt_agent.train.trainer import Trainer, TrainError

SUMMARY_FILE = "summary.json"
PLOTS_DIR = "plots"

__all__ = ["SUMMARY_SCHEMA", "ensure_policy_model", "train_command"]


def ensure_policy_model(cfg: RunConfig, console: Console) -> float:
    """Build ``model.build_preset`` (seed ``model.build_seed``) into ``model.dir`` if it holds no model.

    Returns the seconds spent.

    Any HF checkpoint directory (a ``config.json``) counts as a model; an empty or missing one is
    built with :func:`srt_agent.recipe.build.ensure_model` when ``model.build_if_missing`` is on.

    Raises:
        TrainError: No model there and building is off, or the directory holds something else.
    """
    model_dir = Path(cfg.model.dir)
    if (model_dir / "config.json").is_file():
        return 0.0
    preset = cfg.model.build_preset
    if not cfg.model.build_if_missing:
        raise TrainError(
            f"model.dir = {str(model_dir)!r} holds no model; build one with `srt-agent build-model --out "
            f"{model_dir} --preset {preset}` or set model.build_if_missing=true"
        )
    from srt_agent.env.registration import UnknownEnvError
    from srt_agent.recipe.build import BuildDirError, ensure_model, preset_config, shipped_build

    if shipped_build(preset_config(preset), cfg.model.build_seed) is None:  # else it says it copied one
        console.print(f"[bold]Building the {preset} model into {model_dir}[/bold] (model.dir holds none yet)")
    t0 = time.perf_counter()
    try:
        ensure_model(model_dir, seed=cfg.model.build_seed, config=preset_config(preset))
    except BuildDirError as exc:
        raise TrainError(f"model.dir: {exc}") from None
    except UnknownEnvError as exc:  # the preset's demonstrations need an extra that is missing
        raise TrainError(f"model.build_preset={preset}: {exc}") from None
    return time.perf_counter() - t0


def train_command(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    resume: bool = False,
    json_path: str | Path | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> int:
    """Train: build the model if missing, evaluate, train, evaluate, summarise.

    Writes into ``trainer.out_dir``: ``config.yaml``, ``metrics.jsonl`` (and ``tensorboard/``),
    ``checkpoints/``, ``plots/reward.png`` and ``plots/rollout_time.png``, and ``summary.json``
    (the flat object of :func:`srt_agent.train.summary.summarize`, also written to ``json_path``).

    Args:
        config: The YAML run config.
        overrides: ``dotted.key=value`` overrides.
        resume: Continue from the newest complete checkpoint in ``trainer.out_dir``.
        json_path: Also write the summary here.
        console: Where to print (default: stdout).
        show_progress: Draw progress bars.

    Returns:
        The exit code: 0 done, 2 bad config or arguments (the message says what to fix).
    """
    out = console or make_console()
    t0 = time.perf_counter()
    try:
        cfg = load_config(config, overrides)
        # Checked before anything runs: a typo here should not cost a model build or a run.
        validate_env_options(cfg.env.id, cfg.env.options)
        if cfg.env.oracle_prefix:
            try:
                require_oracle(cfg.env.id, f"env.oracle_prefix={cfg.env.oracle_prefix}")
            except ValueError as exc:
                raise ConfigError([f"{exc}; set env.oracle_prefix=0"], str(config)) from None
        check_output_dir(cfg.trainer.out_dir, "trainer.out_dir")
        check_outputs((json_path, "--json"))
    except (ConfigError, UnknownEnvError, EnvConfigError, OutputPathError) as exc:
        where = {UnknownEnvError: "env.id: ", EnvConfigError: "env.options: "}.get(type(exc), "")
        return print_error(out, f"{where}{exc}")
    try:
        build_s = ensure_policy_model(cfg, out)
        previous = latest_checkpoint(cfg.trainer.out_dir) if resume else None
        done = previous.step if previous is not None else 0
        with TrainProgress(cfg.trainer.steps, done, console=out, disable=not show_progress) as progress:
            trainer = Trainer(cfg, resume=resume, progress=progress)
            for note in trainer.resume_notes:
                out.print(Text.assemble(("not resuming from ", "yellow"), note))
            if trainer.resumed_from:
                out.print(f"resuming from step {trainer.resumed_from} ({cfg.trainer.out_dir})")
            if trainer.metrics.tensorboard_error:
                out.print(f"[yellow]{trainer.metrics.tensorboard_error}[/yellow]")
            try:
                records = trainer.run()
            finally:
                trainer.close()
    except TrainError as exc:
        return print_error(out, exc)
    summary = summarize(
        records,
        cfg,
        wall_s=time.perf_counter() - t0,
        build_s=build_s,
        checkpoint_s=trainer.state.checkpoint_s,
        resumed_from=trainer.resumed_from,
        announced=trainer.state.announced,
    )
    out_dir = Path(cfg.trainer.out_dir)
    plot_run(records, out_dir / PLOTS_DIR)
    write_record(out_dir / SUMMARY_FILE, summary)
    out.print(summary_table(summary))
    out.print(
        f"[dim]wrote {out_dir / SUMMARY_FILE}, {out_dir / PLOTS_DIR}/, {out_dir / 'metrics.jsonl'}[/dim]"
    )
    write_json(out, json_path, summary)
    return 0

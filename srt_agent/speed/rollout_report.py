"""The rollout benchmark's outputs: headline JSON figures, a markdown table and a PNG plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from srt_agent.output.console import make_console
from srt_agent.output.records import write_record
from srt_agent.speed.rollout_speed import (
    CONFIGS,
    HF_CONFIGS,
    LATENCY_CONFIGS,
    RolloutBenchConfig,
    RoundResult,
    totals,
)


def _ratio(reference: float, value: float) -> float:
    return round(reference / value, 3) if value > 0 else 0.0


def _ceiling(wall: float, decode: float) -> float:
    """The most a speedup of decode steps alone can give: ``wall`` with ``decode`` of it made free."""
    return round(wall / (wall - decode), 3) if 0 <= decode < wall else 0.0


def _seconds_per_token(total: dict[str, float]) -> float:
    return total["wall_s"] / total["tokens"] if total["tokens"] else 0.0


def _env_key(env_id: str) -> str:
    return env_id.split("/")[-1].split("-")[0].lower()


def headline(config: RolloutBenchConfig, results: Sequence[RoundResult]) -> dict[str, Any]:
    """The benchmark as one flat JSON object of headline figures.

    Ratios are "speed relative to SRT off": ``off`` wall-clock / the configuration's wall-clock on the
    same rounds (> 1 is faster). Keys:

    * ``srt_speedup``: SRT as configured (``spec.run_ahead``, by default ``auto``: on a GPU only)
      vs off, all rounds; ``srt_runs_ahead``: 1 if that configuration ran ahead, else 0;
      ``srt_runahead_speedup`` / ``srt_no_runahead_speedup``: run-ahead forced on / off.
    * ``srt_speedup_last_round``: the same on the last round only (the cache is warmest).
    * ``srt_speedup_<env>`` (e.g. ``srt_speedup_calculator``): per env, all rounds;
      ``srt_speedup_ceiling_<env>``: the most drafting could give that env (off's wall-clock over
      its wall-clock less its decode steps' time, graph capture included in the latter, so an
      upper bound; the whole workload's, capture excluded, is :func:`limits`'s).
    * ``srt_forward_ratio``: off's target (decode) forwards / SRT's: the speedup in forward passes,
      which machine load does not distort.
    * ``tokens_per_forward``, ``acceptance_rate``, ``mean_accepted``: SRT's live tokens per forward
      pass, accepted / verified draft tokens, accepted draft tokens per drafted step.
    * ``hit_rate_exact``, ``hit_rate_task``, ``hit_rate_global``: share of SRT's draft lookups each
      source answered; ``runahead_accepted_tokens``: accepted draft tokens that only run-ahead
      content had; ``runahead_tokens``: tokens run-ahead requests generated.
    * ``token_prob``: mean probability of the sampled tokens (how often an independent sample of
      the policy would draft the sampled token: the entropy limit of acceptance at this temperature).
    * ``useless_drafts_ratio``: random drafts (cache content disabled) vs off (the bar: >= 0.95).
    * ``cache_only_ratio``: the tree cache filled with every committed token but never asked for a
      draft vs off: what the cache's upkeep alone costs.
    * ``graphs_speedup``: ``eager`` wall-clock / ``off`` wall-clock: what CUDA graphs and bfloat16
      gain on plain decoding (> 1: faster; ~1 on a CPU).
    * ``srt_throughput_ratio``, ``graphs_throughput_ratio``: the same two comparisons in generated
      tokens per second (in bfloat16 a verify forward rounds differently from a decode step, so
      configurations can sample different episodes of different lengths; this ratio does not
      count that against them).
    * ``server_ratio``: the ``server`` configuration (a server at ``--url``, drafting on its side)
      vs the in-process ``off``; ``server_url`` names it.
    * ``hf_generate_ratio``, ``prompt_lookup_ratio``: the HF peers vs off on their first
      ``hf_rounds`` rounds.
    * ``latency200_runahead_acceptance``, ``latency200_no_runahead_acceptance``: acceptance with
      ``latency_s`` (200 ms by default; the key names keep 200) of tool latency, with and without
      run-ahead; ``latency200_runahead_speedup``: no-run-ahead wall-clock / run-ahead wall-clock;
      ``latency200_runahead_tokens_per_forward`` and ``latency200_no_runahead_tokens_per_forward``;
      ``latency200_prediction_hit_rate``: tool-result predictions whose state the live episode reached.
    * ``<config>_wall_s``, ``<config>_tokens``, ``<config>_tokens_per_forward``,
      ``<config>_acceptance_rate``, ``<config>_success_rate`` for every configuration that ran;
      for TorchEngine ones also ``<config>_decode_forwards`` (decode and verify steps),
      ``<config>_forward_s`` (time in those steps: inputs, forward, draws, the read back),
      ``<config>_ms_per_forward``, ``<config>_verify_s`` (of ``forward_s``: after a verify
      forward, walking the trees and committing), ``<config>_draft_s`` (draft lookups), ``<config>_prefill_s``
      and ``<config>_prefill_forwards`` (prefills: every turn's new prompt tokens), with the rows
      and the prompt tokens they computed (``<config>_prefill_rows``, ``<config>_prefill_tokens``),
      ``<config>_engine_idle_s`` (the engine waited with no sequence to run: every one was with the
      driver, in env steps and tokenization), ``<config>_driver_only_s`` (no request was with the
      engine and no env step ran: chat-template rendering, tokenization, the event loop), and the
      per-step split of :func:`step_split` (``<config>_ms_per_decode_step``,
      ``<config>_ms_per_verify_step``, ``<config>_ms_per_prefill`` and their ``device_ms`` twins).
    * ``srt_verify_step_cost``: ``srt_ms_per_verify_step`` / ``off_ms_per_decode_step``, what one
      verify step costs in plain decode steps at this batch (host and device).
    * :func:`bench_rollout` adds each TorchEngine configuration's static-step counters
      (``<config>_graph_replays`` and the others of
      :func:`~srt_agent.speed.rollout_speed.run_rollout_bench`'s ``engine_figures``), and the
      workload's limits (:func:`limits`).
    * The settings: ``model``, ``envs``, ``prompts``, ``samples``, ``rounds``, ``hf_rounds``,
      ``temperature``, ``max_new_tokens``, ``max_turns``, ``drift``, ``latency_s``, ``threads``,
      ``max_batch_size``, ``seed``.

    Figures of configurations that did not run are absent.
    """
    ran = [c for c in CONFIGS if any(r.config == c for r in results)]
    skip = ("configs", "model_dir", "envs", "spec_options", "profile_dir")
    settings = {k: v for k, v in asdict(config).items() if k not in skip}
    cache, spec = config.spec_configs()  # what the speculating configurations ran with
    settings.update(
        backoff_window=cache.backoff_window, draws=spec.draws, max_draft_tokens=spec.max_draft_tokens
    )
    out: dict[str, Any] = {"model": str(config.model_dir), "envs": ",".join(config.envs), **settings}
    tot = {c: totals(results, c) for c in ran}
    off = tot["off"]
    for c in ran:
        t = tot[c]
        out.update(
            {
                f"{c}_wall_s": round(t["wall_s"], 3),
                f"{c}_tokens": int(t["tokens"]),
                f"{c}_tokens_per_forward": round(t["tokens_per_forward"], 3),
                f"{c}_acceptance_rate": round(t["acceptance_rate"], 4),
                f"{c}_success_rate": round(t["success_rate"], 4),
                f"{c}_decode_forwards": int(t["target_forwards"]),
                f"{c}_forward_s": round(t["forward_s"], 3),
                f"{c}_verify_s": round(t["verify_s"], 3),
                f"{c}_draft_s": round(t["draft_s"], 3),
                f"{c}_prefill_s": round(t["prefill_s"], 3),
                f"{c}_prefill_forwards": int(t["prefill_forwards"]),
                f"{c}_prefill_rows": int(t["prefill_rows"]),
                f"{c}_prefill_tokens": int(t["prefill_tokens"]),
                f"{c}_engine_idle_s": round(t["idle_s"], 3),
                f"{c}_driver_only_s": round(t["driver_s"], 3),
                f"{c}_ms_per_forward": round(1000 * t["forward_s"] / t["target_forwards"], 3)
                if t["target_forwards"]
                else 0.0,
                **step_split(c, t),
            }
        )
    if "srt" in tot:
        srt = tot["srt"]
        last = config.rounds - 1
        last_off = sum(r.metrics.wall_s for r in results if r.config == "off" and r.round == last)
        last_srt = sum(r.metrics.wall_s for r in results if r.config == "srt" and r.round == last)
        out.update(
            srt_speedup=_ratio(off["wall_s"], srt["wall_s"]),
            srt_speedup_last_round=_ratio(last_off, last_srt),
            srt_runs_ahead=int(config.run_ahead(force=False).runs_on_device(config.device)),
            srt_forward_ratio=_ratio(off["target_forwards"], srt["target_forwards"]),
            tokens_per_forward=round(srt["tokens_per_forward"], 3),
            acceptance_rate=round(srt["acceptance_rate"], 4),
            mean_accepted=round(srt["mean_accepted"], 3),
            runahead_tokens=int(srt["runahead_tokens"]),
            runahead_accepted_tokens=int(srt["runahead_accepted_tokens"]),
            token_prob=round(srt["token_prob"], 4),
            **{f"hit_rate_{s}": round(srt[f"hit_rate_{s}"], 4) for s in ("exact", "task", "global")},
        )
        for env in config.envs:
            per = [r for r in results if r.env_id == env]
            o = sum(r.metrics.wall_s for r in per if r.config == "off")
            s = sum(r.metrics.wall_s for r in per if r.config == "srt")
            out[f"srt_speedup_{_env_key(env)}"] = _ratio(o, s)
            # Per env from off's own split (graph capture counted as decode time: an upper bound).
            steps = [r.metrics.spec for r in per if r.config == "off"]
            decode = sum(x.forward_s + x.verify_s for x in steps)
            out[f"srt_speedup_ceiling_{_env_key(env)}"] = _ceiling(o, decode)
    if "srt" in tot and out.get("off_ms_per_decode_step") and out.get("srt_ms_per_verify_step"):
        # What a verify step costs in plain decode steps at this workload's batch (host and device).
        out["srt_verify_step_cost"] = round(out["srt_ms_per_verify_step"] / out["off_ms_per_decode_step"], 3)
    if "srt" in tot:
        out["srt_throughput_ratio"] = _ratio(_seconds_per_token(off), _seconds_per_token(tot["srt"]))
    if "eager" in tot:
        out["graphs_speedup"] = _ratio(tot["eager"]["wall_s"], off["wall_s"])
        out["graphs_throughput_ratio"] = _ratio(_seconds_per_token(tot["eager"]), _seconds_per_token(off))
    if "srt_runahead" in tot:
        out["srt_runahead_speedup"] = _ratio(off["wall_s"], tot["srt_runahead"]["wall_s"])
    if "srt_no_runahead" in tot:
        out["srt_no_runahead_speedup"] = _ratio(off["wall_s"], tot["srt_no_runahead"]["wall_s"])
    if "useless" in tot:
        out["useless_drafts_ratio"] = _ratio(off["wall_s"], tot["useless"]["wall_s"])
    if "cache_only" in tot:
        out["cache_only_ratio"] = _ratio(off["wall_s"], tot["cache_only"]["wall_s"])
    if "server" in tot:
        out["server_ratio"] = _ratio(off["wall_s"], tot["server"]["wall_s"])
    for c in HF_CONFIGS:
        if c in tot:
            off_same = totals(results, "off", rounds=min(config.hf_rounds, config.rounds))["wall_s"]
            out[f"{c}_ratio"] = _ratio(off_same, tot[c]["wall_s"])
    if all(c in tot for c in LATENCY_CONFIGS):
        with_ra, without = tot["latency_srt"], tot["latency_srt_no_runahead"]
        out.update(
            latency200_runahead_acceptance=round(with_ra["acceptance_rate"], 4),
            latency200_no_runahead_acceptance=round(without["acceptance_rate"], 4),
            latency200_runahead_tokens_per_forward=round(with_ra["tokens_per_forward"], 3),
            latency200_no_runahead_tokens_per_forward=round(without["tokens_per_forward"], 3),
            latency200_runahead_speedup=_ratio(without["wall_s"], with_ra["wall_s"]),
            latency200_runahead_tokens=int(with_ra["runahead_tokens"]),
            latency200_prediction_hit_rate=round(with_ra["prediction_hit_rate"], 4),
        )
    return out


def step_split(config: str, t: dict[str, float]) -> dict[str, float]:
    """Milliseconds per decode step, verify step and prefill of ``config``, whole and on the device.

    From :func:`~srt_agent.speed.rollout_speed.totals`: ``<config>_ms_per_decode_step`` and
    ``<config>_ms_per_verify_step`` (a whole step: inputs, forward, draws, walk; graph captures
    excluded), ``<config>_ms_per_prefill`` (captures included), and each one's
    ``<config>_device_ms_per_*`` (launching the static step and waiting for it; the rest is the
    host's own work; 0 where steps are not static, e.g. on a CPU by default). A figure is absent
    where no step of its kind ran.
    """
    out: dict[str, float] = {}
    # kind: (how many ran, their seconds, of which on the device)
    kinds = {
        "decode_step": (t["target_forwards"] - t["verify_forwards"], "decode_step_s", "decode_device_s"),
        "verify_step": (t["verify_forwards"], "verify_step_s", "verify_device_s"),
        "prefill": (t["prefill_forwards"], "prefill_s", "prefill_device_s"),
    }
    for kind, (n, whole, device) in kinds.items():
        if n > 0:
            out[f"{config}_ms_per_{kind}"] = round(1000 * t[whole] / n, 3)
            out[f"{config}_device_ms_per_{kind}"] = round(1000 * t[device] / n, 3)
    return out


def step_split_line(record: dict[str, Any]) -> str:
    """One line: off's decode step and prefill, SRT's verify step, each as whole / device ms."""

    def part(label: str, key: str) -> str | None:
        whole = record.get(key)
        if whole is None:
            return None
        return f"{label} {whole:.2f} ms (device {record[key.replace('_ms_', '_device_ms_')]:.2f})"

    parts = [
        part("off decode step", "off_ms_per_decode_step"),
        part("off prefill", "off_ms_per_prefill"),
        part("srt verify step", "srt_ms_per_verify_step"),
        part("srt prefill", "srt_ms_per_prefill"),
    ]
    line = "; ".join(p for p in parts if p is not None)
    if line and "srt_verify_step_cost" in record:
        line += f"; a verify step costs {record['srt_verify_step_cost']:.2f} decode steps"
    return line


def limits(record: dict[str, Any]) -> dict[str, float]:
    """How far drafting can speed this workload up at all, and SRT's ratio without graph capture.

    Speculation shortens decode steps only; prefills, tool waits and the driver's work stay. So
    from ``off``'s own split: ``decode_share`` = its decode steps' time (graph capture excluded) /
    its wall-clock, and ``srt_speedup_ceiling`` = 1 / (1 - ``decode_share``): the ratio SRT would
    reach if every decode step were free. ``srt_speedup_no_capture``: ``srt_speedup`` with each
    side's CUDA graph capture taken out of its wall-clock (a once-per-process cost that a short
    benchmark charges to few rounds, and SRT captures more shapes: its verify widths). Keys absent
    where the figures they need are.
    """
    out: dict[str, float] = {}
    wall, forward = record.get("off_wall_s"), record.get("off_forward_s")
    if not wall or forward is None:
        return out
    capture = record.get("off_graph_capture_s", 0.0)
    step_capture = capture - record.get("off_prefill_capture_s", 0.0)  # inside forward_s
    decode = max(0.0, forward - step_capture)
    out["decode_share"] = round(decode / wall, 4)
    out["srt_speedup_ceiling"] = _ceiling(wall, decode)
    srt_wall = record.get("srt_wall_s")
    if srt_wall:
        srt_capture = record.get("srt_graph_capture_s", 0.0)
        out["srt_speedup_no_capture"] = _ratio(wall - capture, srt_wall - srt_capture)
    return out


def markdown_table(config: RolloutBenchConfig, results: Sequence[RoundResult]) -> str:
    """One row per configuration: wall-clock, ratio vs off, tokens, speculation and run-ahead figures."""
    head = (
        "| config | rounds | wall-clock | vs SRT off | tokens | tokens/forward | acceptance "
        "| draft hits exact/task/global | run-ahead tokens |"
    )
    lines = [head, "|" + "---|" * 9]
    for c in CONFIGS:
        t = totals(results, c)
        if not t["batches"]:
            continue
        rounds = int(t["batches"]) // len(config.envs)
        reference = totals(results, "off", rounds=rounds)["wall_s"] if c not in LATENCY_CONFIGS else 0.0
        ratio = f"{reference / t['wall_s']:.2f}x" if reference and t["wall_s"] else "-"
        spec = c not in ("off", "hf_generate", "prompt_lookup")
        hits = "/".join(f"{t[f'hit_rate_{s}']:.0%}" for s in ("exact", "task", "global")) if spec else "-"
        tpf = f"{t['tokens_per_forward']:.2f}" if c not in HF_CONFIGS else "-"
        lines.append(
            f"| {c} | {rounds} | {t['wall_s']:.1f} s | {ratio} | {int(t['tokens'])} | {tpf} "
            f"| {t['acceptance_rate']:.1%} | {hits} | {int(t['runahead_tokens']) if spec else '-'} |"
        )
    return "\n".join(lines)


def write_plot(results: Sequence[RoundResult], path: Path) -> str:
    """Wall-clock per round per configuration and SRT's tokens per forward, as a PNG.

    Returns:
        A line for the terminal: where the plot went.
    """
    import matplotlib  # a dependency of the package; imported here, only when a plot is drawn

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for c in CONFIGS:
        rows = [r for r in results if r.config == c]
        if not rows:
            continue
        rounds = sorted({r.round for r in rows})
        wall = [sum(r.metrics.wall_s for r in rows if r.round == k) for k in rounds]
        color = f"C{CONFIGS.index(c)}"  # the same colour for a configuration in both panels
        left.plot(rounds, wall, marker="o", label=c, color=color)
        if c not in HF_CONFIGS and c != "off":
            tpf = []
            for k in rounds:
                tok = sum(r.metrics.live_tokens for r in rows if r.round == k)
                fwd = sum(r.metrics.live_forward_passes for r in rows if r.round == k)
                tpf.append(tok / fwd if fwd else 0.0)
            right.plot(rounds, tpf, marker="o", label=c, color=color)
    # Log scale: the HF peers can be ten times slower than the rest.
    left.set(xlabel="round", ylabel="wall-clock per round (s)", title="Rollout wall-clock", yscale="log")
    right.set(xlabel="round", ylabel="tokens per forward", title="Speculation gain")
    for ax in (left, right):
        ax.xaxis.get_major_locator().set_params(integer=True)
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def bench_rollout(
    config: RolloutBenchConfig,
    *,
    json_path: Path | None = None,
    plot_path: Path | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """What ``srt-agent bench rollout`` runs: the benchmark, a line per batch, the table, plot and JSON.

    Args:
        config: What to run.
        json_path: Write :func:`headline` here.
        plot_path: Write the PNG plot here.
        console: A rich console to print to (default: stdout).

    Returns:
        The headline figures (:func:`headline`).

    Raises:
        FileNotFoundError: The model directory does not exist.
    """
    from srt_agent.speed.rollout_speed import run_rollout_bench

    out = console or make_console()

    def progress(r: RoundResult) -> None:
        m = r.metrics
        out.print(
            f"[dim]round {r.round} {r.config:<24} {r.env_id:<20} {m.wall_s:6.2f} s  "
            f"{m.live_tokens:6d} tokens  {m.tokens_per_forward:4.2f} tok/fwd  "
            f"accept {m.spec.acceptance_rate:5.1%}[/dim]",
            soft_wrap=True,
        )

    figures: dict[str, float | int | str] = {}
    results = run_rollout_bench(config, on_round=progress, engine_figures=figures)
    record = {**headline(config, results), **figures}
    record.update(limits(record))
    out.print(markdown_table(config, results), markup=False, soft_wrap=True)
    if "srt_speedup_ceiling" in record:
        line = (
            f"off spends {record['decode_share']:.0%} of its wall-clock in decode steps: free decode "
            f"steps would give at most {record['srt_speedup_ceiling']:.2f}x"
        )
        if "srt_speedup_no_capture" in record:
            line += f"; SRT without graph capture {record['srt_speedup_no_capture']:.2f}x"
        per_env = [
            (k.removeprefix("srt_speedup_ceiling_"), v)
            for k, v in record.items()
            if k.startswith("srt_speedup_ceiling_")
        ]
        if per_env:
            line += " (per env, capture included: " + ", ".join(f"{e} {v:.2f}x" for e, v in per_env) + ")"
        out.print(line, markup=False, soft_wrap=True)
    split = step_split_line(record)
    if split:
        out.print(split, markup=False, soft_wrap=True)
    if plot_path is not None:
        out.print(write_plot(results, plot_path))
    if json_path is not None:
        write_record(json_path, record)
        out.print(f"wrote {json_path}")
    return record

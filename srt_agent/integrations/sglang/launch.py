"""``srt-agent sglang-serve``: start SGLang's server with SRT drafting inside it.

It runs ``python -m sglang.launch_server`` with ``--speculative-algorithm SRT`` (registered by
srt-agent's ``sglang.srt.plugins`` entry point in every SGLang process), the exact acceptance
thresholds, and the caller's other SGLang flags passed through unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from srt_agent.integrations.sglang.plugin import ALGORITHM, EXACT_THRESHOLDS, SPEC_FILE_VARIABLE

__all__ = ["launch", "server_command", "server_env"]

PLUGIN_NAME = "srt"
"""srt-agent's entry-point name in the ``sglang.srt.plugins`` group (see pyproject.toml)."""


def server_command(
    model: str, *, host: str, port: int, draft_tokens: int, extra: Sequence[str] = ()
) -> list[str]:
    """The SGLang launch command (``python -m sglang.launch_server ...``).

    Raises:
        ValueError: ``extra`` sets a flag this command owns (the algorithm or a threshold).
    """
    owned = {"--speculative-algorithm", *("--" + k.replace("_", "-") for k in EXACT_THRESHOLDS)}
    clash = sorted({a.split("=", 1)[0] for a in extra} & owned)
    if clash:
        raise ValueError(f"{', '.join(clash)}: set by srt-agent sglang-serve (SRT needs them as they are)")
    if draft_tokens < 2:
        raise ValueError(f"--draft-tokens must be >= 2 (the root and one draft slot), got {draft_tokens}")
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", model, "--host", host, "--port", str(port),
        "--speculative-algorithm", ALGORITHM,
        "--speculative-num-draft-tokens", str(draft_tokens),
    ]  # fmt: skip
    for name, value in EXACT_THRESHOLDS.items():
        cmd += ["--" + name.replace("_", "-"), str(value)]
    return [*cmd, *extra]


def server_env(environ: dict[str, str] | None = None, spec_file: str | Path | None = None) -> dict[str, str]:
    """The environment for SGLang: srt-agent's plugin added to ``SGLANG_PLUGINS`` if it is a list.

    With ``spec_file`` (a run config), every SGLang process's SRT worker reads its ``spec``
    section through :data:`~srt_agent.integrations.sglang.plugin.SPEC_FILE_VARIABLE` (SGLang's
    argument parser cannot take plugin options).
    """
    env = dict(os.environ if environ is None else environ)
    if spec_file is not None:
        env[SPEC_FILE_VARIABLE] = str(Path(spec_file).resolve())
    allowed = [p.strip() for p in env.get("SGLANG_PLUGINS", "").split(",") if p.strip()]
    if allowed and PLUGIN_NAME not in allowed:  # an allow-list that would skip SRT's registration
        env["SGLANG_PLUGINS"] = ",".join([*allowed, PLUGIN_NAME])
    return env


def launch(
    model: str,
    *,
    host: str,
    port: int,
    draft_tokens: int,
    extra: Sequence[str] = (),
    spec_file: str | Path | None = None,
) -> None:
    """Replace this process with SGLang's server (never returns).

    Raises:
        RuntimeError: SGLang is not installed here (it needs a CUDA machine).
        ValueError: See :func:`server_command`.
    """
    cmd = server_command(model, host=host, port=port, draft_tokens=draft_tokens, extra=extra)
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError(
            "SGLang is not installed in this environment: on a CUDA machine, "
            '`pip install "sglang==0.5.23"`, then run this again (on CPU, `srt-agent serve` serves '
            "the embedded engine with the same API)"
        )
    os.execvpe(cmd[0], cmd, server_env(spec_file=spec_file))

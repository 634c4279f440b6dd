"""Default locations of things the CLI builds and reads."""

from __future__ import annotations

import os
from pathlib import Path

from srt_agent.errors import SrtAgentError


def default_model_dir() -> Path:
    """Where ``srt-agent build-model`` writes the embedded model and other commands look for it.

    ``$SRT_AGENT_MODEL`` if set, else ``runs/embedded-model`` under the current directory (so a
    fresh clone starts without one, and ``runs/`` is git-ignored).
    """
    return Path(os.environ.get("SRT_AGENT_MODEL", "runs/embedded-model"))


class OutputPathError(SrtAgentError, ValueError):
    """An output path cannot be written (the message names it and what is wrong)."""


def check_output_file(path: str | Path, what: str) -> None:
    """Check, before a long run, that ``path`` can be written, so results are not lost after it.

    Creates the parent folder if needed; an existing file is left as it is (opened for append and
    closed), a probe of a new one is removed again.

    Raises:
        OutputPathError: ``path`` is a folder, its folder cannot be made, or it is not writable.
    """
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{what} {p} is a folder; give a file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{what} {p}: cannot create its folder {p.parent} ({exc.strerror})") from None
    existed = p.exists()
    try:
        with p.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise OutputPathError(f"{what} {p} is not writable ({exc.strerror}); choose another path") from None
    if not existed:
        p.unlink(missing_ok=True)


def check_output_dir(path: str | Path, what: str) -> None:
    """Check that ``path`` is, or can be made, a writable folder.

    Raises:
        OutputPathError: ``path`` is a file, or the folder cannot be made or written to.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{what} {p} is a file, not a folder; choose a folder path")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"{what} {p}: cannot create it ({exc.strerror})") from None
    check_output_file(p / ".srt-write-check", what)


def built_models(root: str | Path = "runs") -> list[Path]:
    """Model folders (holding a ``config.json``) directly under ``root``, sorted by name."""
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if (p / "config.json").is_file())


def resolve_model_dir(model: str | Path | None) -> tuple[Path, str]:
    """The model folder a command should use, and a note to print when it was picked for the user.

    ``model`` if given; else the default (:func:`default_model_dir`) if it holds a model; else the
    only model under ``runs/`` (the quickstart builds ``runs/tool-choice-model``).

    Raises:
        FileNotFoundError: No model there; the message lists the models found and how to pick one.
    """
    if model is not None:
        path = Path(model)
        if not (path / "config.json").is_file():
            what = "does not exist" if not path.exists() else "holds no model (no config.json)"
            raise FileNotFoundError(f"model dir {path} {what}; {_choices()}")
        return path, ""
    default = default_model_dir()
    if (default / "config.json").is_file():
        return default, ""
    found = built_models()
    if len(found) == 1:
        return found[0], f"using {found[0]} (no model at {default}; it is the only one under runs/)"
    raise FileNotFoundError(f"no model at {default}; {_choices()}")


def _choices() -> str:
    found = built_models()
    if not found:
        return "build one with `srt-agent build-model` (or pass --model DIR)"
    return "models found: " + ", ".join(str(p) for p in found) + "; pick one with --model DIR"

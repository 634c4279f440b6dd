"""The installed layout: envs/ and tools/ ship as srt_agent.envs / srt_agent.tools, with no symlinks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["setuptools"])


def _package_dirs(name: str, folder: Path) -> set[str]:
    return {
        ".".join([name, *init.parent.relative_to(folder).parts])
        for init in folder.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_the_package_list_names_every_package_on_disk() -> None:
    config = _setuptools()
    mapped = dict(config["package-dir"])  # type: ignore[call-overload]
    assert mapped == {"srt_agent.envs": "envs", "srt_agent.tools": "tools"}
    on_disk = _package_dirs("srt_agent", ROOT / "srt_agent")
    for name, folder in mapped.items():
        on_disk |= _package_dirs(name, ROOT / folder)
    assert set(config["packages"]) == on_disk  # type: ignore[call-overload]


def test_the_package_folder_holds_no_symlinks() -> None:
    links = [p for p in (ROOT / "srt_agent").rglob("*") if p.is_symlink()]
    assert links == []


def test_envs_and_tools_import_under_the_package_only(tmp_path: Path) -> None:
    import srt_agent.envs
    import srt_agent.tools

    assert Path(srt_agent.envs.__file__).parent == ROOT / "envs"
    assert Path(srt_agent.tools.__file__).parent == ROOT / "tools"
    # the install maps the two folders; it must not put the checkout on a user's sys.path
    probe = "import importlib.util as u; print(u.find_spec('envs'), u.find_spec('tools'))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.split() == ["None", "None"], out.stderr

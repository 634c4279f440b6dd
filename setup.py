"""Builds srt-agent's optional native core (``srt_agent._native``, C++ with pybind11).

Everything else about the package is in ``pyproject.toml``. Without a C++ compiler the install
still succeeds: the extension is skipped with a warning and srt-agent runs its Python
implementations (it says so once at run time, with how to get the native core).
"""

from __future__ import annotations

import sys

from pybind11.setup_helpers import Pybind11Extension
from pybind11.setup_helpers import build_ext as _build_ext
from setuptools import setup


class OptionalBuildExt(_build_ext):
    """``build_ext`` that warns instead of failing when the native core cannot be compiled."""

    def run(self) -> None:
        """Build every extension, or warn and go on without them."""
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 (no compiler, missing headers, ...: fall back to Python)
            _skipped(exc)

    def build_extension(self, ext: Pybind11Extension) -> None:
        """Build one extension, or warn and go on without it."""
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            _skipped(exc)


def _skipped(exc: Exception) -> None:
    print(
        f"WARNING: srt-agent's native core was not built ({type(exc).__name__}: {exc}); srt-agent will "
        "run its Python implementations. Install a C++17 compiler (e.g. g++) and reinstall to build it.",
        file=sys.stderr,
    )


setup(
    ext_modules=[
        Pybind11Extension(
            "srt_agent._native",
            ["native/srt_native.cpp", "native/tree_core.cpp", "native/tree_core_py.cpp"],
            cxx_std=17,
            extra_compile_args=["-O3"],
            include_dirs=["native"],
            depends=["native/tree_core.h"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)

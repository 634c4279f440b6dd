"""Shared pytest setup: register the built-in envs once for every test; shared fixtures.

``--require-imports`` (what every CI tier runs with) turns ``pytest.importorskip`` into a plain
import: a package a tier installed that no longer imports (a broken pin, an API moved) fails the
tier instead of skipping its tests. ``--require-imports-of=ray,tensorboard`` does it for those
packages (and their submodules) only: the main tier collects the other tiers' files too (their
markers deselect them only after their module-level imports ran). On a developer's machine
without the optional packages the same tests skip, as they should.
"""

import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

import srt_agent.envs  # noqa: F401 - registers srt/* envs with gymnasium

_IMPORTORSKIP = pytest.importorskip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-imports",
        action="store_true",
        help="fail, not skip, where pytest.importorskip cannot import its module (CI tiers)",
    )
    parser.addoption(
        "--require-imports-of",
        default="",
        metavar="MODULES",
        help="--require-imports for these modules only (comma-separated; submodules included)",
    )


def _strict_importorskip(required: frozenset[str] | None) -> Callable[..., Any]:
    """A ``pytest.importorskip`` that fails for ``required`` modules (``None``: every module)."""

    def importorskip(
        modname: str, minversion: str | None = None, reason: str | None = None, **kw: Any
    ) -> Any:
        if required is not None and modname.split(".")[0] not in required and modname not in required:
            return _IMPORTORSKIP(modname, minversion=minversion, reason=reason, **kw)
        try:
            module: ModuleType = importlib.import_module(modname)
        except ImportError as exc:
            why = f" ({reason})" if reason else ""
            pytest.fail(
                f"{modname} must import in this tier{why}: {type(exc).__name__}: {exc}", pytrace=False
            )
        if minversion is not None:
            _IMPORTORSKIP(modname, minversion=minversion)  # the version check alone (the import worked)
        return module

    return importorskip


def pytest_configure(config: pytest.Config) -> None:
    named = frozenset(m.strip() for m in config.getoption("--require-imports-of").split(",") if m.strip())
    if config.getoption("--require-imports") or named:
        required = None if config.getoption("--require-imports") else named
        pytest.importorskip = _strict_importorskip(required)  # type: ignore[assignment]


def pytest_unconfigure(config: pytest.Config) -> None:
    pytest.importorskip = _IMPORTORSKIP


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for a module (use: ``pytestmark = pytest.mark.usefixtures(...)``).

    Tiny models gain nothing from a second thread, and on a busy 2-core machine an OpenMP barrier
    waiting for a descheduled thread makes every op ~1000x slower.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(params=["python", "native"])
def cache_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test once per tree cache core (use: ``pytestmark = pytest.mark.usefixtures(...)``).

    Every :class:`~srt_agent.tree_cache.TreeCache` the test builds gets that core; the native one
    prices its bytes as the Python one does, so byte counts and evictions are the same.
    """
    from srt_agent import native
    from srt_agent.tree_cache import cache as cache_module

    backend = str(request.param)
    if backend == "native" and native.core is None:
        pytest.skip("the native core is not built (or SRT_NATIVE=0)")
    real = cache_module.make_core

    def forced(config: Any, python_prices: bool = False) -> Any:
        return real(config.model_copy(update={"backend": backend}), python_prices=True)

    monkeypatch.setattr(cache_module, "make_core", forced)
    return backend

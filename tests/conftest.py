"""Shared pytest setup: register the built-in envs once for every test; shared fixtures."""

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import srt_agent.envs  # noqa: F401 - registers srt/* envs with gymnasium


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

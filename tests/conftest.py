"""Shared pytest setup: register the built-in envs once for every test; shared fixtures."""

from collections.abc import Iterator

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

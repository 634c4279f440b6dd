"""vllm.utils stand-in."""

import uuid


def random_uuid() -> str:
    """A request id."""
    return uuid.uuid4().hex

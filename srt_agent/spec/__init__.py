"""Speculative rollouts (SRT): a tree cache of earlier continuations and exact tree verification."""

from srt_agent.spec.draft import EMPTY_DRAFT, DraftSource, DraftSourceProtocol, DraftTree, StreamKind

__all__ = ["EMPTY_DRAFT", "DraftSource", "DraftSourceProtocol", "DraftTree", "StreamKind"]

"""Tool results seen earlier in a rollout, to predict the observation of a repeated tool call.

Run-ahead (:mod:`srt_agent.rollout.runahead`) uses it: when every call of a turn was made before
with the same arguments in the same env and task, the post-tool conversation can be rendered and
generated from while the real tools run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from srt_agent.chat.messages import Message, tool_result
from srt_agent.tooling.parser import ToolCall


def canonical_arguments(arguments: dict[str, object]) -> str:
    """Arguments as canonical JSON (sorted keys, no spaces): equal calls give equal text."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class ToolMemo:
    """Tool results seen so far: ``(env id, task id, tool name, canonical arguments) -> result text``.

    Keyed per task, because a task's tools read the task's data (a retail order, a calculation).
    Predictions can still be wrong (a tool whose result depends on earlier calls in the episode);
    that costs only the wasted run-ahead, and the hit rate is measured.

    Args:
        max_entries: Most results remembered (the oldest are forgotten first).
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._results: dict[tuple[str, str, str, str], str] = {}

    def __len__(self) -> int:
        return len(self._results)

    @staticmethod
    def key(env_id: str, task_id: str, call: ToolCall) -> tuple[str, str, str, str]:
        """The memo key of one call."""
        return (env_id, task_id, call.name, canonical_arguments(call.arguments))

    def record(
        self, env_id: str, task_id: str, calls: Sequence[ToolCall], observation: Sequence[Message]
    ) -> bool:
        """Remember the results of a turn's calls from the env's observation of that turn.

        Only an observation that is exactly one tool message per call, in order and with matching
        names, is recorded (otherwise the pairing of calls and results would be a guess).

        Returns:
            Whether the results were recorded.
        """
        if not calls or len(observation) != len(calls):
            return False
        if any(
            m.role != "tool" or (m.name is not None and m.name != c.name)
            for m, c in zip(observation, calls, strict=True)
        ):
            return False
        for call, message in zip(calls, observation, strict=True):
            key = self.key(env_id, task_id, call)
            self._results.pop(key, None)  # re-insert: newest last
            self._results[key] = message.content
        while len(self._results) > self.max_entries:
            del self._results[next(iter(self._results))]
        return True

    def predict(self, env_id: str, task_id: str, calls: Sequence[ToolCall]) -> list[Message] | None:
        """The tool messages the env would return for ``calls``, if every result is known."""
        if not calls:
            return None
        contents = [self._results.get(self.key(env_id, task_id, c)) for c in calls]
        if any(c is None for c in contents):
            return None
        return [
            tool_result(text, call_id=c.id, name=c.name)
            for c, text in zip(calls, contents, strict=True)
            if text is not None
        ]

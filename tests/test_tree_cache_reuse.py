"""Draft reuse across episodes and across turns, on real chat-format token sequences.

The policy is scripted (fixed turns), and a tiny engine loop does what the speculative engine does:
before each step it asks the cache for a draft from the current state, accepts the drafted tokens
that the policy really produces next (as exact verification would for a policy that emits them),
commits them plus one sampled token, and feeds the committed tokens to the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from chat_fixtures import tiny_tokenizer

from srt_agent.chat.messages import system, tool_result, user
from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.contracts.draft import DraftTree
from srt_agent.contracts.generation import state_key
from srt_agent.tree_cache import TreeCache, TreeCacheConfig

pytestmark = pytest.mark.usefixtures("cache_backend")

TASK = "calculator-2+2"
TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Math.", "parameters": {}}}]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'
BUDGET = 8


@dataclass
class Turn:
    key: str
    tokens: list[int]
    forwards: int = 0
    sources: list[str] = field(default_factory=list)


def accepted(draft: DraftTree, target: list[int]) -> int:
    """How many drafted tokens a policy that emits ``target`` next accepts (walk down the tree)."""
    node, n = -1, 0
    while n < len(target):
        nxt = [c for c in draft.children(node) if draft.token_ids[c] == target[n]]
        if not nxt:
            break
        node, n = nxt[0], n + 1
    return n


def generate(cache: TreeCache, stream: str, prompt: tuple[int, ...], target: list[int]) -> Turn:
    turn = Turn(state_key(prompt), target)
    done = 0
    while done < len(target):
        draft = cache.draft(turn.key, TASK, prompt, target[:done], BUDGET)
        turn.sources.append(draft.source)
        step = min(accepted(draft, target[done:]) + 1, len(target) - done)  # + the token sampled after
        cache.extend(stream, turn.key, TASK, target[done : done + step])
        turn.forwards += 1
        done += step
    cache.finish(stream)
    return turn


def play(fmt: ChatFormat, cache: TreeCache, episode: int, answers: list[str], tool_output: str) -> list[Turn]:
    """One episode: a tool call, the tool's result, an answer; returns its generated turns."""
    im_end = fmt.stop_token_ids[0]
    tr: TokenTranscript = fmt.start([system("Be brief."), user("What is 2+2?")], TOOLS)
    turns = []
    for i, text in enumerate(answers):
        target = [*fmt.encode(text), im_end]
        turns.append(generate(cache, f"ep{episode}/turn{i}", tr.token_ids, target))
        tr = fmt.add_generation(tr, target, [-0.1] * len(target))
        if i + 1 < len(answers):
            tr = fmt.add_observation(tr, [tool_result(tool_output, call_id=f"call_{i}", name="calculator")])
    return turns


def test_a_second_episode_of_the_task_drafts_from_the_first() -> None:
    fmt = ChatFormat(tiny_tokenizer())
    # No back-off: the turn's own earlier tokens would then give one-token suffix matches.
    cache = TreeCache(TreeCacheConfig(backoff_window=0))
    first = play(fmt, cache, 0, [CALL], tool_output="4")
    assert first[0].forwards == len(first[0].tokens)  # cold: nothing to draft from, one token per forward
    second = play(fmt, cache, 1, [CALL], tool_output="4")
    # The same task starts from the same prompt tokens, so the same state key, and the first
    # episode's continuation is an exact draft: whole blocks of BUDGET + 1 tokens per forward.
    assert second[0].key == first[0].key
    assert set(second[0].sources) == {"exact"}
    n = len(CALL)  # characters bound tokens from above
    assert second[0].forwards == -(-len(second[0].tokens) // (BUDGET + 1)) < n
    # A third episode that diverges mid-turn drafts exactly up to the divergence, then falls back
    # to suffix matching (and back onto the tree's text where it matches again).
    third = play(fmt, cache, 2, [CALL.replace("2+2", "2*2")], tool_output="4")
    assert third[0].sources[0] == "exact"
    assert third[0].forwards < len(third[0].tokens) // 2
    cache.check_integrity()


def test_a_repeated_tool_result_reuses_the_next_turns_tree() -> None:
    fmt = ChatFormat(tiny_tokenizer())
    cache = TreeCache()
    answer = "The answer is <answer>4</answer>."
    first = play(fmt, cache, 0, [CALL, answer], tool_output="4")
    # Another episode makes the same call and the tool returns the same result: the prefix of
    # turn 1 is token-identical, so its state key matches and turn 1's tree applies at once.
    again = play(fmt, cache, 1, [CALL, answer], tool_output="4")
    assert again[1].key == first[1].key
    assert again[1].sources[0] == "exact"
    assert again[1].forwards == -(-len(again[1].tokens) // (BUDGET + 1))
    # A different tool result is a new state: no exact tree, but the task's earlier turns are
    # matched on the suffix (the start of a continuation), so drafting still starts at once.
    other = play(fmt, cache, 2, [CALL, answer.replace("4", "5")], tool_output="5")
    assert other[1].key not in (first[1].key, first[0].key)
    assert other[1].sources[0] == "task"
    assert other[1].forwards < len(other[1].tokens)
    cache.check_integrity()

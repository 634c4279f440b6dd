"""The stumbling demonstrator: one mistyped call, its error, the oracle's retry; the mistake untrained."""

import numpy as np
import pytest
from model_fixtures import tokenizer

from srt_agent.chat.messages import assistant, system, tool_result, user
from srt_agent.chat.template import ChatFormat
from srt_agent.recipe.demos import DemoSource, collect_demos, to_transcript
from srt_agent.recipe.stumble import MISTAKE_AT_MOST, mistype_call
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls
from srt_agent.tooling.toolset import is_error_message

ENV_ID = "srt/Retail-v0"


@pytest.fixture(scope="module")
def stumbles():
    return collect_demos(ENV_ID, 12, demonstrator="stumble")


@pytest.fixture(scope="module")
def oracle_runs():
    return collect_demos(ENV_ID, 12)


def test_every_episode_is_still_solved_with_one_untrained_mistake_that_drew_an_error(stumbles) -> None:
    assert len(stumbles) == 12  # the same seeds as the oracle's, all solved after the retry
    for d in stumbles:
        assert d.total_reward > 0
        wrong = [i for i, t in enumerate(d.turns) if not t.trained]
        assert len(wrong) == 1, d.seed
        i = wrong[0]
        calls_before = sum(parse_tool_calls(t.action).has_calls for t in d.turns[:i])
        assert calls_before < MISTAKE_AT_MOST
        assert any(is_error_message(m) for m in d.turns[i].observation)
        assert not any(is_error_message(m) for m in d.turns[i + 1].observation)


def test_the_retry_is_the_oracle_call_and_the_rest_is_the_oracle_episode(stumbles, oracle_runs) -> None:
    for s, o in zip(stumbles, oracle_runs, strict=True):
        assert s.seed == o.seed
        i = next(i for i, t in enumerate(s.turns) if not t.trained)
        kept = s.turns[:i] + s.turns[i + 1 :]
        assert [t.action for t in kept] == [t.action for t in o.turns]
        assert s.turns[i].action != s.turns[i + 1].action


def test_the_mistake_has_no_loss_and_every_other_assistant_turn_has(stumbles) -> None:
    fmt = ChatFormat(tokenizer())
    for d in stumbles[:4]:
        tr = to_transcript(fmt, d)
        for (s, e), turn in zip(tr.turn_spans, d.turns, strict=True):
            assert set(tr.loss_mask[s:e]) == {int(turn.trained)}
        assert sum(tr.loss_mask) == sum(
            e - s for (s, e), t in zip(tr.turn_spans, d.turns, strict=True) if t.trained
        )


def test_a_mistyped_call_changes_one_character_or_breaks_the_json() -> None:
    call = format_tool_call("get_order_details", {"order_id": "#W4340262"})
    kinds = set()
    for seed in range(40):
        wrong = mistype_call(call, np.random.default_rng(seed))
        assert wrong is not None and wrong != call
        parsed = parse_tool_calls(wrong)
        if parsed.calls:
            got = parsed.calls[0].arguments["order_id"]
            assert len(got) == len("#W4340262")
            assert sum(a != b for a, b in zip(got, "#W4340262", strict=True)) == 1
            assert got[:2] == "#W"  # digits are preferred to letters
            kinds.add("value")
        else:
            assert parsed.errors
            kinds.add("json")
    assert kinds == {"value", "json"}
    assert mistype_call("No call here.", np.random.default_rng(0)) is None


def test_the_source_label_names_the_demonstrator() -> None:
    assert DemoSource(ENV_ID, 10, demonstrator="stumble").label == "srt/Retail-v0/stumble"


def test_an_episode_whose_mistake_drew_no_error_is_dropped_as_showing_no_recovery() -> None:
    from srt_agent.recipe.demos import _to_demo

    call = format_tool_call("lookup", {"key": "a1"})
    transcript = [
        system("s"),
        user("u"),
        assistant(call),
        tool_result("fine", call_id="c0", name="lookup"),
        assistant(call),
        tool_result("Error (error): no such key", call_id="c1", name="lookup"),
        assistant("done"),
    ]
    assert _to_demo("e", 0, transcript, (), 1.0, frozenset({0})) is None
    demo = _to_demo("e", 0, transcript, (), 1.0, frozenset({1}))
    assert demo is not None and [t.trained for t in demo.turns] == [True, False, True]

"""Copied tool-call values (a name, an id read earlier) are found, placed on tokens and weighed up."""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import pytest
from model_fixtures import demos, tokenizer

from srt_agent.chat.template import ChatFormat
from srt_agent.recipe import parallel
from srt_agent.recipe.build import _weighted, weighted_example
from srt_agent.recipe.copies import copied_spans, copy_mask
from srt_agent.recipe.demos import collect_demos, to_transcript
from srt_agent.tooling.parser import format_tool_call, parse_tool_calls

SEEN = "Hi, my name is Liam Johnson and my zip code is 15660. Items 1234567890 and 555."


def _values(action: str, spans: list[tuple[int, int]]) -> list[str]:
    return [action[a:b] for a, b in spans]


def test_copied_spans_are_the_call_values_seen_before() -> None:
    action = format_tool_call(
        "find_user_id_by_name_zip",
        {"first_name": "Liam", "last_name": "Johnson", "zip": "15660", "note": "never said", "n": 3},
    )
    assert _values(action, copied_spans(action, SEEN)) == ["Liam", "Johnson", "15660"]
    nested = format_tool_call("r", {"order": {"item_ids": ["1234567890", "999"], "why": "5"}})
    assert _values(nested, copied_spans(nested, SEEN)) == ["1234567890"]  # '5' is too short, '999' unseen
    twice = (
        "I will look you up, Liam.\n"
        + format_tool_call("f", {"a": "Liam"})
        + format_tool_call("g", {"b": "Liam"})
    )
    assert _values(twice, copied_spans(twice, SEEN)) == ["Liam", "Liam"]  # in calls only, not the text
    assert copied_spans("Liam Johnson, right?", SEEN) == []  # no call, no copy


def test_copy_mask_marks_the_copied_values_of_retail_calls_and_nothing_untrained() -> None:
    fmt = ChatFormat(tokenizer())
    looked_up_by_name = 0
    for d in collect_demos("srt/Retail-v0", 8, build_seed=3):
        tr = to_transcript(fmt, d)
        mask = copy_mask(fmt, d, tr)
        assert len(mask) == len(tr.token_ids)
        assert all(m <= t for m, t in zip(mask, tr.loss_mask, strict=True))  # only the policy's tokens
        for turn, (start, end) in zip(d.turns, tr.turn_spans, strict=True):
            marked = fmt.decode(
                [t for t, m in zip(tr.token_ids[start:end], mask[start:end], strict=True) if m]
            )
            for call in parse_tool_calls(turn.action).calls:
                for key in ("order_id", "user_id", "last_name", "email"):
                    if key in call.arguments:
                        assert call.arguments[key] in marked, (d.seed, key, marked)
                looked_up_by_name += call.name == "find_user_id_by_name_zip"
            if not parse_tool_calls(turn.action).has_calls:
                assert not marked, (d.seed, turn.action)  # a text turn has no call values
    assert looked_up_by_name > 0


def test_copied_tokens_weigh_copy_weight_and_digits_the_larger() -> None:
    ids, loss, copies = (1, 2, 3, 4, 5), (0, 1, 1, 1, 1), (1, 1, 0, 1, 0)
    digits = frozenset({4, 5})
    ex = weighted_example(ids, loss, "g", digits, 6.0, copies, 3.0)
    assert ex.weights == (0.0, 3.0, 1.0, 6.0, 6.0)  # untrained 0; copy 3; plain 1; digit+copy 6; digit 6
    assert weighted_example(ids, loss, "g", digits, 6.0, copies, 9.0).weights == (0.0, 9.0, 1.0, 9.0, 6.0)
    assert weighted_example(ids, loss, "g", digits, 6.0).weights == (0.0, 1.0, 1.0, 6.0, 6.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the build forks only on Linux")
def test_copies_found_in_workers_equal_serial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "MIN_CHUNK", 2)
    fmt = ChatFormat(tokenizer())
    retail = demos()["srt/Retail-v0"]
    weigh = partial(_weighted, "r", frozenset(), 6.0, copy_weight=4.0)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        got = parallel.tokenize_all(fmt, retail, pool, 2, weigh, copies=True)
    want = [
        weigh(tr.token_ids, tr.loss_mask, copy_mask(fmt, d, tr))
        for d, tr in ((d, to_transcript(fmt, d)) for d in retail)
    ]
    assert got == want
    assert any(4.0 in e.weights for e in got if e.weights)
    plain = parallel.tokenize_all(fmt, retail, None, 1, weigh)  # copies not asked for: none weighed
    assert all(4.0 not in (e.weights or ()) for e in plain)

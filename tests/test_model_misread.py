"""Retail's misreading demonstrator: one request misread after the order look-up, the customer's
correction, then the oracle's episode; the misread turn untrained."""

import re

import pytest

from srt_agent.envs.retail.misread import WRONG_ASKS
from srt_agent.recipe.demos import collect_demos
from srt_agent.tooling.parser import parse_tool_calls

ENV_ID = "srt/Retail-v0"


@pytest.fixture(scope="module")
def misreads():
    return collect_demos(ENV_ID, 12, demonstrator="misread")


@pytest.fixture(scope="module")
def oracle_runs():
    return collect_demos(ENV_ID, 12)


def test_every_episode_is_solved_after_one_untrained_misread_the_customer_corrects(misreads) -> None:
    assert len(misreads) == 12  # the oracle's seeds, all still solved after the correction
    misread = 0
    for d in misreads:
        assert d.total_reward > 0
        wrong = [i for i, t in enumerate(d.turns) if not t.trained]
        assert len(wrong) <= 1, d.seed
        if not wrong:  # a task that never reads an order (a product's price) has nothing to misread
            assert not any('"get_order_details"' in t.action for t in d.turns)
            continue
        misread += 1
        turn = d.turns[wrong[0]]
        assert not parse_tool_calls(turn.action).has_calls
        assert any(
            turn.action == ask.format(order_id=o) for ask in WRONG_ASKS.values() for o in _ids(turn.action)
        )
        assert [m.role for m in turn.observation] == ["user"]  # the customer's correction
        assert '"get_order_details"' in d.turns[wrong[0] - 1].action  # right after reading the order
    assert misread >= 6


def test_the_misread_asks_about_another_request_kind(misreads) -> None:
    from srt_agent.env.registration import make

    env = make(ENV_ID)
    for d in misreads:
        env.reset(seed=d.seed)
        kind = env.unwrapped.task.kind  # type: ignore[attr-defined]
        for t in d.turns:
            if not t.trained:
                asked = [
                    k
                    for k, ask in WRONG_ASKS.items()
                    for o in _ids(t.action)
                    if t.action == ask.format(order_id=o)
                ]
                assert asked and kind not in asked, (kind, t.action)
    env.close()


def test_the_other_turns_are_the_oracle_episode_up_to_the_misread(misreads, oracle_runs) -> None:
    for m, o in zip(misreads, oracle_runs, strict=True):
        assert m.seed == o.seed
        i = next((i for i, t in enumerate(m.turns) if not t.trained), len(m.turns))
        assert [t.action for t in m.turns[:i]] == [t.action for t in o.turns[:i]]


def test_the_misreading_demonstrator_refuses_other_envs() -> None:
    with pytest.raises(ValueError, match="srt/Retail-v0 only"):
        collect_demos("srt/Calculator-v0", 1, demonstrator="misread")


def _ids(text: str) -> list[str]:
    return re.findall(r"#W\d{7}", text)

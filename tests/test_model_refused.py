"""Retail's refused-proposal demonstrator: one to three wrong proposals, each refused by the
customer, then the oracle's episode; the wrong proposals untrained."""

import pytest

from srt_agent.envs.retail.oracle import PROPOSAL_END
from srt_agent.envs.retail.refused import MOST_REFUSALS
from srt_agent.recipe.demos import collect_demos

ENV_ID = "srt/Retail-v0"


@pytest.fixture(scope="module")
def refused():
    return collect_demos(ENV_ID, 24, demonstrator="refused")


@pytest.fixture(scope="module")
def oracle_runs():
    return collect_demos(ENV_ID, 24)


def test_every_episode_is_solved_after_its_refused_proposals(refused) -> None:
    assert len(refused) == 24  # the oracle's seeds, all still solved
    counts = []
    for d in refused:
        assert d.total_reward > 0
        wrong = [i for i, t in enumerate(d.turns) if not t.trained]
        counts.append(len(wrong))
        for i in wrong:
            turn = d.turns[i]
            assert turn.action.endswith(PROPOSAL_END)
            [reply] = turn.observation
            assert reply.role == "user" and not reply.content.lower().startswith("yes"), reply.content
        if wrong:  # the turn after the last refusal (the right proposal) is learned
            assert d.turns[wrong[-1] + 1].trained
        # The accepted proposal is a trained turn, and it is not any of the refused ones.
        accepted = [t for t in d.turns if t.trained and t.action.endswith(PROPOSAL_END)]
        assert all(t.action not in {d.turns[i].action for i in wrong} for t in accepted[-1:])
    assert set(counts) == set(range(MOST_REFUSALS + 1))  # info tasks propose nothing: 0


def test_the_other_turns_are_the_oracle_episode_up_to_the_first_refusal(refused, oracle_runs) -> None:
    for r, o in zip(refused, oracle_runs, strict=True):
        assert r.seed == o.seed
        i = next((i for i, t in enumerate(r.turns) if not t.trained), len(r.turns))
        assert [t.action for t in r.turns[:i]] == [t.action for t in o.turns[:i]]
        if i < len(r.turns):  # the oracle proposed at that turn, right, where the demonstrator was wrong
            assert o.turns[i].action.endswith(PROPOSAL_END) and o.turns[i].action != r.turns[i].action
        # Refusals lengthen the conversation by two messages each and change nothing else.
        assert len(r.turns) == len(o.turns) + sum(not t.trained for t in r.turns)


def test_the_refused_demonstrator_refuses_other_envs() -> None:
    with pytest.raises(ValueError, match="srt/Retail-v0 only"):
        collect_demos("srt/Calculator-v0", 1, demonstrator="refused")


def test_the_long_demonstrator_refuses_up_to_eighteen_proposals_within_the_turn_limit() -> None:
    from srt_agent.envs.retail.refused import LONG_REFUSALS

    long = collect_demos(ENV_ID, 24, demonstrator="refused-long")
    assert len(long) == 24  # every task still solved, within the env's 30 turns
    counts = [sum(not t.trained for t in d.turns) for d in long]
    assert max(counts) > MOST_REFUSALS and max(counts) <= LONG_REFUSALS
    assert max(len(d.turns) for d in long) <= 30
    from srt_agent.envs.retail.refused import RefusedProposalOracle

    with pytest.raises(ValueError, match="most_refusals=0"):  # an import error would not pass for it
        RefusedProposalOracle(None, None, most_refusals=0)  # type: ignore[arg-type]

from collections.abc import Sequence
from typing import Any

import pytest
from model_fixtures import ENV_IDS, demos, tokenizer

from srt_agent.chat.messages import Message, user
from srt_agent.chat.template import ChatFormat
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import MultiTurnEnv, Observation, Transition
from srt_agent.env.registration import register_env
from srt_agent.recipe.demos import DEMO_SEED_BASE, SEEDS_PER_BUILD, collect_demos, demo_seeds, to_transcript


def test_demo_seeds_stay_clear_of_evaluation_seeds_and_of_other_builds() -> None:
    a, b = demo_seeds(1000, 0), demo_seeds(1000, 1)
    assert min(a) == DEMO_SEED_BASE and min(b) == DEMO_SEED_BASE + SEEDS_PER_BUILD
    assert not set(a) & set(b)
    with pytest.raises(ValueError, match="count"):
        demo_seeds(SEEDS_PER_BUILD + 1, 0)
    with pytest.raises(ValueError, match="seed"):
        demo_seeds(1, -1)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_demos_are_solved_episodes_split_into_turns(env_id: str) -> None:
    ds = demos()[env_id]
    assert len(ds) == 6 and [d.seed for d in ds] == list(demo_seeds(6, 0))
    for d in ds:
        assert d.total_reward > 0 and d.env_id == env_id
        assert [m.role for m in d.opening] == ["system", "user"]
        assert d.turns and d.turns[-1].observation == ()  # the answer to the last turn trains nothing
        assert all(t.observation for t in d.turns[:-1])
        assert (len(d.tools) > 0) == (env_id != "srt/GuessNumber-v0")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_loss_mask_covers_exactly_the_assistant_tokens(env_id: str) -> None:
    fmt = ChatFormat(tokenizer())
    for d in demos()[env_id]:
        tr = to_transcript(fmt, d)
        assert len(tr.turn_spans) == len(d.turns)
        covered = set()
        for (s, e), turn in zip(tr.turn_spans, d.turns, strict=True):
            # Each span is the oracle's text plus the end-of-turn token, all trained on.
            assert fmt.decode(tr.token_ids[s:e]) == turn.action + "<|im_end|>"
            assert fmt.decode(tr.token_ids[:s]).endswith("<|im_start|>assistant\n")
            covered.update(range(s, e))
        assert {i for i, m in enumerate(tr.loss_mask) if m} == covered
        assert tr.token_ids[-1] == fmt.stop_token_ids[0]


def test_the_mental_demonstrator_solves_each_problem_in_one_turn_without_the_tool() -> None:
    from srt_agent.recipe.demos import collect_demos

    ds = collect_demos("srt/Calculator-v0", 20, demonstrator="mental")
    assert len(ds) == 20  # every answer is right
    for d in ds:
        assert len(d.turns) == 1 and "<tool_call>" not in d.turns[0].action
        assert d.turns[0].action.count(" = ") >= 2  # each step's arithmetic written out (2-5 steps)
        assert d.turns[0].action.rstrip().endswith("</answer>")


def test_two_demonstrators_of_one_env_play_disjoint_seeds() -> None:
    from srt_agent.recipe.demos import DemoSource, source_seeds

    sources = [
        DemoSource("srt/Calculator-v0", 5),
        DemoSource("srt/GuessNumber-v0", 3),
        DemoSource("srt/Calculator-v0", 4, "mental"),
    ]
    calc, guess, mental = source_seeds(sources, build_seed=2)
    assert calc == demo_seeds(5, 2) and guess == demo_seeds(3, 2)
    assert list(mental) == list(demo_seeds(9, 2))[5:]  # right after the oracle's block
    labels = [s.label for s in sources]
    assert labels == ["srt/Calculator-v0", "srt/GuessNumber-v0", "srt/Calculator-v0/mental"]


def test_bad_demo_sources_are_named_in_the_error() -> None:
    from srt_agent.recipe.demos import DemoSource, check_sources, collect_demos

    with pytest.raises(ValueError, match=r"unknown demonstrator 'telepathy'.*oracle, mental"):
        check_sources([DemoSource("srt/Calculator-v0", 1, "telepathy")])
    with pytest.raises(ValueError, match="srt/Calculator-v0 is listed twice"):
        check_sources([DemoSource("srt/Calculator-v0", 1), DemoSource("srt/Calculator-v0", 2)])
    with pytest.raises(ValueError, match="more than the"):
        half = SEEDS_PER_BUILD // 2 + 1
        calc = "srt/Calculator-v0"
        check_sources([DemoSource(calc, half), DemoSource(calc, half, "mental")])
    with pytest.raises(ValueError, match="GuessNumberEnv has none"):
        collect_demos("srt/GuessNumber-v0", 1, demonstrator="mental")


class _SayHi:
    def act(self, history: Sequence[Message]) -> str:
        return "hi"


class OddSeedsBreak(MultiTurnEnv):
    """Reset raises on odd seeds (as Retail did on a task it could not complete)."""

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        if self._seed % 2:
            raise RuntimeError("this task cannot be completed")
        return f"t{self._seed}", [user("say hi")]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self._seed = seed or 0
        return super().reset(seed=seed, options=options)

    def on_message(self, text: str) -> Transition:
        return Transition(reward=1.0, terminated=True)

    def oracle(self) -> Policy:
        return _SayHi()


def test_a_task_whose_env_raises_is_skipped_and_the_other_demos_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    register_env("test/OddSeedsBreak-v0", OddSeedsBreak)
    got = collect_demos("test/OddSeedsBreak-v0", 4)
    assert [d.seed % 2 for d in got] == [0, 0]
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 2

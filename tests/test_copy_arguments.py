"""Copied tool arguments: string values come from the conversation, and the learner scores that.

``rollout.copy_tool_arguments`` narrows a constrained call's string values to the words and quoted
strings of the turn's prompt outside the policy's own earlier turns. The grammar then depends on
the prompt, so the engine (live rows and drafted tree positions alike) and the learner must derive
the same one. The engine test uses a random model over eight tokens whose only tool takes one
string: the prompt's user text says ``Liam``, an earlier call of the policy said ``Ava``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
from pydantic import ValidationError
from spec_drafters import ModelDrafts
from test_constrained_decoding import one_turn_trajectory
from test_engine_spec_exact import save_exact_model

from srt_agent.contracts.generation import GenerationRequest, SamplingParams
from srt_agent.contracts.trajectory import Trajectory
from srt_agent.engine.constraint import CallMasks, CallTracker, Vocabulary
from srt_agent.engine.speculation.spec_config import SpecConfig
from srt_agent.engine.torch_engine import TorchEngine
from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import oracle_policy
from srt_agent.rollout.config import RolloutConfig
from srt_agent.tooling.copying import copy_candidates, turn_grammar
from srt_agent.tooling.grammar import CallState, ToolCallGrammar
from srt_agent.tooling.parser import split_blocks
from srt_agent.train.constrained import allowed_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "reason": {"type": "string", "enum": ["lost", "broken"]},
                    "count": {"type": "integer"},
                },
                "required": ["name"],
            },
        },
    }
]


def call(args: str) -> str:
    return '{"name": "find", "arguments": {' + args + "}}"


# ---------------------------------------------------------------- the grammar


def test_candidates_are_the_words_and_quoted_strings_of_the_text() -> None:
    text = (
        "I am Liam Johnson, zip 15660. Mail: liam.j@example.com. Order #W8732376-"
        ' {"item_id": "1016157130", "name": "Running Shoes", "note": "caf\u00e9"}'
    )
    words = copy_candidates(text)
    assert {"Liam", "Johnson", "15660", "liam.j@example.com", "#W8732376", "1016157130"} <= words
    assert "Running Shoes" in words  # a JSON string value with a space
    assert "15660." not in words and "Johnson," not in words  # sentence punctuation is not copied
    quoted = copy_candidates("I'd cancel it: reason 'no longer needed'. The customer's 'x y' or 'z'")
    assert {"no longer needed", "x y", "z"} <= quoted  # values quoted in prose
    assert not any(" " in w and w not in ("no longer needed", "x y") for w in quoted)  # no apostrophe pairs


def test_every_oracle_call_of_every_retail_task_kind_can_be_copied() -> None:
    """Under copied arguments the oracle's calls stay writable: no goal becomes impossible.

    The context is what the tracker reads (the conversation outside the policy's turns, without the
    system prompt, which small models' templates leave out); a value only a docstring or the
    policy's own call holds must come from an ``enum`` (the cancellation reason does).
    """
    env = gym.make("srt/Retail-v0")
    grammar = ToolCallGrammar.from_schemas(env.unwrapped.tools.schemas(), copy_strings=True)
    calls = 0
    for kind in ("cancel", "return", "exchange", "info"):
        for seed in range(3):
            result = run_episode(env, oracle_policy, seed=seed, options={"task_kind": kind})
            assert result.total_reward == 1.0
            for turn, block in turn_calls(grammar, result.transcript):
                state = turn.feed(turn.start(), block)
                assert state is not None and state.ended, (kind, seed, block)
                calls += 1
    assert calls >= 12 * 3


def turn_calls(grammar: ToolCallGrammar, transcript: Any) -> Iterator[tuple[ToolCallGrammar, str]]:
    """Each call block of an episode's assistant turns, with the grammar its turn decodes under.

    The context is what the tracker reads: the conversation outside the policy's turns, without the
    system prompt (which small models' templates leave out).
    """
    seen: list[str] = []
    for message in transcript[1:]:
        if message.role != "assistant":
            seen.append(message.content)
            continue
        _, blocks = split_blocks(message.content)
        turn = turn_grammar(grammar, copy_candidates("\n".join(seen)))
        for block in blocks:
            yield turn, block


def test_a_copy_grammar_accepts_copies_and_refuses_inventions() -> None:
    base = ToolCallGrammar.from_schemas(TOOLS, copy_strings=True)
    turn = turn_grammar(base, copy_candidates('Hi, I am Liam; orders "#W1" and "#W22"'))
    assert turn is turn_grammar(base, copy_candidates('Hi, I am Liam; orders "#W1" and "#W22"'))
    whole = turn.feed(
        turn.start(), call('"name": "Liam", "ids": ["#W1", "#W22"], "reason": "lost", "count": 3')
    )
    assert whole is not None and whole.ended
    assert turn.feed(turn.start(), call('"name": "Ava"')) is None  # not in the conversation
    assert turn.feed(turn.start(), call('"name": "Lia"')) is None  # a prefix of a word is not a word
    assert turn.feed(turn.start(), call('"name": "Liam", "ids": ["#W3"]')) is None
    assert turn.feed(turn.start(), call('"name": "Liam", "reason": "Liam"')) is None  # enums stay enums
    # the base grammar (no prompt seen yet) and an ordinary one leave strings free
    assert base.feed(base.start(), call('"name": "Ava"')) is not None
    plain = ToolCallGrammar.from_schemas(TOOLS)
    assert turn_grammar(plain, {"Liam"}) is plain
    # nothing copyable: strings stay free rather than impossible to write
    empty = turn_grammar(base, {'a"b', "caf\u00e9"})
    assert empty.feed(empty.start(), call('"name": "Ava"')) is not None


def test_copy_without_constraint_is_a_config_error_naming_the_fix() -> None:
    with pytest.raises(ValidationError, match="constrain_tool_calls=true"):
        RolloutConfig(copy_tool_arguments=True)
    assert RolloutConfig(copy_tool_arguments=True, constrain_tool_calls=True).copy_tool_arguments


# ---------------------------------------------------------------- engine and learner

# a call is HEAD, the value's pieces, TAIL: '{"name": "find", "arguments": {"name": ' '"Li' 'am' '"}}'
TEXTS = ("<tool_call>", "</tool_call>", call('"name": "')[:-3], '"}}', '"Li', "am", '"Ava', "<|im_end|>")
OPEN, CLOSE, HEAD, TAIL, LI, AM, AVA, END = range(8)
V = len(TEXTS)
GRAMMAR = ToolCallGrammar.from_schemas(
    [{"name": "find", "parameters": {"properties": {"name": {"type": "string"}}, "required": ["name"]}}]
)
COPY = ToolCallGrammar(GRAMMAR.tools, copy_strings=True)
# user text "Liam, then an earlier call of the policy with "Ava" (its tool's reply did not echo it)
PROMPT = (END, LI, AM, END, OPEN, HEAD, AVA, TAIL, CLOSE, END)


class PieceTokenizer:
    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(TEXTS[t] for t in token_ids if not (skip_special_tokens and t == END))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_exact_model(tmp_path_factory.mktemp("copy"))


def values(tokens: tuple[int, ...]) -> list[str]:
    """The whole string values of the call blocks in ``tokens`` (between HEAD and TAIL, unquoted)."""
    out: list[str] = []
    text: str | None = None
    last = None
    for t in tokens:
        if t == HEAD and last == OPEN:  # a HEAD outside a block is only text
            text = ""
        elif t == TAIL and text is not None:
            out.append(text.removeprefix('"'))
            text = None
        elif text is not None:
            text += TEXTS[t]
        last = t
    return out


def test_the_turn_grammar_comes_from_the_prompt_outside_earlier_calls() -> None:
    vocab = Vocabulary(PieceTokenizer(), V)
    tracker = CallTracker(COPY, vocab)
    tracker.resume(PROMPT)
    assert tracker.grammar is not COPY
    start = tracker.grammar.feed(tracker.grammar.start(), TEXTS[HEAD])
    assert start is not None
    assert tracker.grammar.feed(start, '"Liam"') is not None
    assert tracker.grammar.feed(start, '"Ava"') is None  # the policy's own earlier value


CHATML = (
    "<tool_call>",
    "</tool_call>",
    '"Li',
    "am",
    '"Ava',
    "<|im_start|>",
    "<|im_end|>",
    "user",
    "assistant",
    "\n",
)


class ChatTokenizer:
    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        special = (CHATML.index("<|im_start|>"), CHATML.index("<|im_end|>"))
        return "".join(CHATML[t] for t in token_ids if not (skip_special_tokens and t in special))


def chat_prompt(*messages: tuple[str, tuple[str, ...]]) -> list[int]:
    """ChatML token ids of ``(role, pieces)`` messages, then the assistant's turn header."""
    ids: list[int] = []
    for role, pieces in (*messages, ("assistant", ())):
        ids += [CHATML.index(p) for p in ("<|im_start|>", role, "\n", *pieces)]
        if role != "assistant" or pieces:
            ids.append(CHATML.index("<|im_end|>"))
    return ids


@pytest.mark.parametrize("second", ["assistant", "user"])
def test_the_policys_own_prose_is_not_copyable(second: str) -> None:
    """A value the policy only wrote in its own text (an invented id in a proposal) is not a copy."""
    vocab = Vocabulary(ChatTokenizer(), len(CHATML))
    tracker = CallTracker(COPY, vocab)
    tracker.resume(chat_prompt(("user", ('"Li', "am")), (second, ('"Ava',))))
    start = tracker.grammar.feed(tracker.grammar.start(), TEXTS[HEAD])
    assert start is not None
    assert tracker.grammar.feed(start, '"Liam"') is not None
    copyable = tracker.grammar.feed(start, '"Ava"') is not None
    assert copyable == (second == "user")  # the same words from the user stay copyable


def sample(
    model_dir: Path, grammar: ToolCallGrammar, n: int
) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """``n`` seeded generations after PROMPT under ``grammar``, drafts random (so they draft ``Ava``)."""
    spec = SpecConfig(adaptive=False, max_draft_tokens=5, max_batch_tokens=256 * 6)
    requests = [
        GenerationRequest(
            f"r{i}",
            PROMPT,
            SamplingParams(temperature=1.0, max_new_tokens=8, seed=7 + i),
            tool_grammar=grammar,
        )
        for i in range(n)
    ]
    with TorchEngine(
        model_dir,
        max_batch_size=256,
        draft_source=ModelDrafts(lambda context: None, V, seed=5),
        spec=spec,
        tokenizer=PieceTokenizer(),
    ) as eng:
        outs = eng.generate(requests)
        assert eng.spec_stats().tokens_per_forward > 1.05  # drafted positions were verified under masks
    assert all(not o.error for o in outs), outs[0].error
    return [(o.token_ids, o.logprobs) for o in outs]


def test_the_engine_copies_and_the_learner_scores_the_same_masks(model_dir: Path) -> None:
    copied = sample(model_dir, COPY, 200)
    written = [v for seq, _ in copied for v in values(seq)]
    assert len(written) > 20  # calls were opened and their values written under the mask
    assert set(written) == {"Liam"}  # never "Ava", never an invention
    free = [v for seq, _ in sample(model_dir, GRAMMAR, 200) for v in values(seq)]
    assert any("Ava" in v for v in free)  # without copying the model does write it: the test can fail

    trajectories = [one_turn_trajectory(i, PROMPT, seq, lps, COPY) for i, (seq, lps) in enumerate(copied)]
    masks = CallMasks(Vocabulary(PieceTokenizer(), V), torch.device("cpu"))
    logits = masked_logits(model_dir, trajectories)
    checked, differ = 0, 0
    for traj, row in zip(trajectories, logits, strict=True):
        allowed = allowed_tokens(traj, masks)
        for position, mask in allowed.items():
            lp = row[position - 1].masked_fill(~mask, float("-inf")).log_softmax(-1)
            assert abs(float(lp[traj.token_ids[position]]) - traj.logprobs[position]) < 1e-4
            checked += 1
        base = dict(states(traj))  # what a learner that ignored copying would have masked with
        differ += sum(not torch.equal(masks.mask(GRAMMAR, base[p]), m) for p, m in allowed.items())
    assert checked > 50 and differ > 20


def states(traj: Trajectory) -> list[tuple[int, CallState]]:
    """The base grammar's states along the generated tokens (what a learner that ignored copying used)."""
    tracker = CallTracker(GRAMMAR, Vocabulary(PieceTokenizer(), V))
    tracker.resume(PROMPT)
    out: list[tuple[int, CallState]] = []
    for position in range(len(PROMPT), len(traj.token_ids)):
        if tracker.state is not None:
            out.append((position, tracker.state))
        tracker.feed((traj.token_ids[position],))
    return out


def masked_logits(model_dir: Path, trajectories: list[Trajectory]) -> list[torch.Tensor]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        return [hf(torch.tensor([t.token_ids])).logits[0] for t in trajectories]


WINDOW = 4
SAMPLES = 3_000


def test_copied_samples_follow_the_masked_distribution(model_dir: Path) -> None:
    """Chi-square of the first tokens of copy-constrained samples against the exact joint distribution.

    The reference masks come from the grammar fed character by character from the prompt's own
    user text (``Liam``), independent of the tracker's derivation; drafts are random, so the verify
    step sees drafted calls with refused values.
    """
    from collections import Counter

    from stats_fixtures import chi_square_p
    from transformers import AutoModelForCausalLM

    reference = turn_grammar(COPY, {"Liam", "im_end"})

    def mask(context: tuple[int, ...]) -> torch.Tensor | None:
        state: CallState | None = None
        for t in context:
            if state is None:
                state = reference.start() if t == OPEN else None
            elif t == CLOSE:
                state = None if state.ended else state
                if state is not None:
                    return None  # refused: a closing tag inside an unfinished call
            else:
                state = reference.feed(state, TEXTS[t]) if t not in (OPEN, END) else None
                if state is None:
                    return None
        if state is None:
            return torch.ones(V, dtype=torch.bool)
        if state.ended:
            return torch.tensor([t == CLOSE for t in range(V)])
        return torch.tensor(
            [t not in (OPEN, CLOSE, END) and reference.feed(state, TEXTS[t]) is not None for t in range(V)]
        )

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    grid = torch.cartesian_prod(*[torch.arange(V)] * WINDOW)
    with torch.no_grad():
        logits = hf(torch.cat([torch.tensor(PROMPT).expand(len(grid), -1), grid], dim=1)).logits
    conditional: dict[tuple[int, ...], torch.Tensor] = {}
    for i, cont in enumerate(grid.tolist()):
        for k in range(WINDOW):
            context = tuple(cont[:k])
            allowed = mask(context)
            if context not in conditional and allowed is not None:
                row = logits[i, len(PROMPT) - 1 + k].masked_fill(~allowed, float("-inf"))
                conditional[context] = row.softmax(-1)
    joint = {(): 1.0}
    for _ in range(WINDOW):
        joint = {
            (*c, t): p * float(conditional[c][t])
            for c, p in joint.items()
            for t in range(V)
            if conditional[c][t] > 0
        }

    seqs = [seq for seq, _ in sample(model_dir, COPY, SAMPLES)]
    counts = Counter(s[:WINDOW] for s in seqs)
    p_value = chi_square_p(counts, joint, SAMPLES)
    inside = sum(1 for s in seqs if OPEN in s[: WINDOW - 1])
    print(f"copied: p = {p_value:.3f}, {len(counts)} cells, {inside} samples open a call")
    assert p_value > 0.01
    assert inside > SAMPLES // 20  # calls were opened inside the window and their values drawn


@pytest.fixture(scope="module")
def retail_vocab() -> tuple[ToolCallGrammar, Vocabulary, list[Any]]:
    """Retail's copy grammar, a vocabulary trained on oracle conversations (its tokens cross from
    keys into copied values, as ``' "#'`` does), and those conversations."""
    from srt_agent.recipe.tokenizer import train_tokenizer

    env = gym.make("srt/Retail-v0")
    grammar = ToolCallGrammar.from_schemas(env.unwrapped.tools.schemas(), copy_strings=True)
    episodes = [
        run_episode(env, oracle_policy, seed=seed, options={"task_kind": kind})
        for kind, seed in (("exchange", 0), ("return", 1))
    ]
    tokenizer = train_tokenizer([m.content for e in episodes for m in e.transcript], vocab_size=700)
    return grammar, Vocabulary(tokenizer, len(tokenizer)), episodes


@functools.cache
def trie_ids(vocab: Vocabulary) -> tuple[int, ...]:
    """Every token id the vocabulary's trie holds (the tokens a call may contain)."""
    ids: list[int] = []
    stack = [vocab.root]
    while stack:
        node = stack.pop()
        ids.extend(node.ids)
        stack.extend(node.children.values())
    return tuple(ids)


def accepted(vocab: Vocabulary, turn: ToolCallGrammar, state: CallState) -> set[int]:
    """The tokens ``turn`` accepts in ``state``, checked one by one (no trie walk, no cache)."""
    if state.ended:
        return {vocab.close_id}
    return {i for i in trie_ids(vocab) if turn.feed(state, vocab.texts[i]) is not None}


def allowed_ids(mask: torch.Tensor) -> set[int]:
    return set(torch.nonzero(mask).flatten().tolist())


def test_masks_are_exactly_the_tokens_the_turn_grammar_accepts(
    retail_vocab: tuple[ToolCallGrammar, Vocabulary, list[Any]],
) -> None:
    """The mask walk (pruned by the grammar's next characters, cached across turns where no copy
    candidate decides a token) against a token-by-token check, over every state of the Retail
    oracle's calls in two episodes; the call's opening is walked once for every turn's grammar."""
    grammar, vocab, episodes = retail_vocab
    masks = CallMasks(vocab, torch.device("cpu"))
    checked, starts = 0, []
    for episode in episodes:
        for turn, block in turn_calls(grammar, episode.transcript):
            starts.append((turn, masks.mask(turn, turn.start())))
            state: CallState | None = turn.start()
            for ch in block:
                assert state is not None
                assert allowed_ids(masks.mask(turn, state)) == accepted(vocab, turn, state), (block, state)
                checked += 1
                state = turn.advance(state, ch)
    assert checked > 300
    assert len({id(t) for t, _ in starts}) > 3  # a new grammar nearly every turn: candidates grow
    assert all(m is starts[0][1] for _, m in starts)  # one walk of the call's opening served them all


def test_a_mask_that_reads_copies_is_never_shared_between_turns(
    retail_vocab: tuple[ToolCallGrammar, Vocabulary, list[Any]],
) -> None:
    """Right after ``"order_id":`` a token such as ``' "#'`` is allowed only where a candidate
    starts with ``#``: that state's mask must come from its own turn's candidates."""
    grammar, vocab, _ = retail_vocab
    masks = CallMasks(vocab, torch.device("cpu"))
    head = '{"name": "get_order_details", "arguments": {"order_id":'
    order, user = turn_grammar(grammar, {"#W8732376"}), turn_grammar(grammar, {"liam_johnson_4492"})
    states = [t.feed(t.start(), head) for t in (order, user)]
    assert states[0] == states[1] and states[0] is not None  # one state, two turns' candidates
    want = [accepted(vocab, t, s) for t, s in zip((order, user), states, strict=True)]  # type: ignore[arg-type]
    assert want[0] != want[1]
    for turn, state, expected in zip((order, user), states, want, strict=True):
        assert allowed_ids(masks.mask(turn, state)) == expected  # type: ignore[arg-type]

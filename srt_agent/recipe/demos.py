"""Oracle demonstrations of the built-in envs, as chat conversations and as training token sequences.

Seed scheme (so training never sees an evaluation task): demonstrations for a build with seed ``s``
reset their envs with seeds ``DEMO_SEED_BASE + s * SEEDS_PER_BUILD + i``, i.e. from 10,000,000 up;
every seed below :data:`DEMO_SEED_BASE` is left for evaluation (``srt-agent eval`` uses small seeds,
0, 1, 2, ...).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import gymnasium as gym

from srt_agent.chat.messages import Message
from srt_agent.chat.template import ChatFormat, TokenTranscript
from srt_agent.env.episode_loop import Policy, run_episode
from srt_agent.env.multi_turn import MultiTurnEnv, Observation, oracle_policy
from srt_agent.env.registration import make
from srt_agent.errors import describe_fault
from srt_agent.recipe.stumble import stumbling_policy
from srt_agent.recipe.tokenizer import render_chat
from srt_agent.tooling.parser import parse_tool_calls
from srt_agent.tooling.toolset import is_error_message

log = logging.getLogger("srt_agent.recipe")

DEMO_SEED_BASE = 10_000_000
"""Smallest env seed used for demonstrations; smaller seeds are reserved for evaluation."""
SEEDS_PER_BUILD = 1_000_000
"""Demonstration seeds available to one build seed (``count`` must stay below this)."""


def mental_policy(env: gym.Env[Observation, str]) -> Policy:
    """The env's tool-free demonstrator (``mental_oracle()``, e.g. ``srt/Calculator-v0``'s).

    Raises:
        ValueError: The env has no ``mental_oracle``.
    """
    make_policy = getattr(env.unwrapped, "mental_oracle", None)
    if make_policy is None:
        raise ValueError(
            f"demonstrator 'mental' needs an env with a mental_oracle() (srt/Calculator-v0 has one); "
            f"{type(env.unwrapped).__name__} has none: use demonstrator 'oracle'"
        )
    policy: Policy = make_policy()
    return policy


def misreading_policy(env: gym.Env[Observation, str]) -> Policy:
    """Retail's misreading demonstrator (:mod:`srt_agent.envs.retail.misread`), imported when used."""
    from srt_agent.envs.retail.misread import misreading_policy as make_policy

    return make_policy(env)


def refused_proposal_policy(env: gym.Env[Observation, str]) -> Policy:
    """Retail's refused-proposal demonstrator (:mod:`srt_agent.envs.retail.refused`), imported when used."""
    from srt_agent.envs.retail.refused import refused_proposal_policy as make_policy

    return make_policy(env)


def long_refused_proposal_policy(env: gym.Env[Observation, str]) -> Policy:
    """Retail's refused-proposal demonstrator with up to ``LONG_REFUSALS`` (18) refusals: long talks."""
    from srt_agent.envs.retail.refused import LONG_REFUSALS
    from srt_agent.envs.retail.refused import refused_proposal_policy as make_policy

    return make_policy(env, LONG_REFUSALS)


DEMONSTRATORS: dict[str, Callable[[gym.Env[Observation, str]], Policy]] = {
    "oracle": oracle_policy,
    "mental": mental_policy,
    "stumble": stumbling_policy,
    "misread": misreading_policy,
    "refused": refused_proposal_policy,
    "refused-long": long_refused_proposal_policy,
}
"""Who plays the demonstrations, by name: the env's oracle, its tool-free demonstrator, the
oracle with one call mistyped and retried (:mod:`srt_agent.recipe.stumble`), or (Retail) the
oracle with the request misread once and corrected by the customer
(:mod:`srt_agent.envs.retail.misread`), or with one to three proposals made wrong and refused
first (:mod:`srt_agent.envs.retail.refused`), or one to eighteen (``refused-long``)."""


class DemoSource(NamedTuple):
    """Demonstrations of one env by one demonstrator.

    Attributes:
        env_id: A registered env, or an id ``make`` resolves (``reasoning_gym:basic_arithmetic``).
        episodes: Episodes to play.
        demonstrator: A key of :data:`DEMONSTRATORS`.
        options: Env options passed to ``make`` (an env family's difficulty, its tool).
        turns: Keep only each solved episode's first ``turns`` assistant turns (``None``: all): the
            opening of long episodes, the same skills (copying a name, an id) in a short context,
            many more of them per trained token.
        drill: Train on this source alone first, for the build's ``drill_steps``, then with the
            others (a skill that forms late, such as copying, learned where it is cheapest).
        finish: Train on this source (with the other finishing ones) only after the main stage,
            in the build's ``finish`` stage; it is also kept out of the tokenizer's training text,
            so adding a finishing stage leaves the tokenizer and the main stage as they were.
    """

    env_id: str
    episodes: int
    demonstrator: str = "oracle"
    options: Mapping[str, Any] | None = None
    turns: int | None = None
    drill: bool = False
    finish: bool = False

    @property
    def label(self) -> str:
        """The env id and what sets the source apart.

        ``/<demonstrator>`` (not the oracle), ``/first<turns>`` (a cut), ``/finish`` (a finishing source).
        """
        label = self.env_id if self.demonstrator == "oracle" else f"{self.env_id}/{self.demonstrator}"
        label = label if self.turns is None else f"{label}/first{self.turns}"
        return f"{label}/finish" if self.finish else label


def demonstrator_policy(name: str) -> Callable[[gym.Env[Observation, str]], Policy]:
    """The policy factory of demonstrator ``name``.

    Raises:
        ValueError: ``name`` is not a key of :data:`DEMONSTRATORS`.
    """
    if name not in DEMONSTRATORS:
        raise ValueError(f"unknown demonstrator {name!r}; choose from {', '.join(DEMONSTRATORS)}")
    return DEMONSTRATORS[name]


def check_sources(sources: Sequence[DemoSource]) -> None:
    """Raise ``ValueError`` for a bad source or a repeated one, or for too many episodes.

    A bad source: an unknown demonstrator, ``turns`` below 1, or both a drill and a finishing one.
    """
    labels = [s.label for s in sources]
    for s in sources:
        demonstrator_policy(s.demonstrator)
        if s.turns is not None and s.turns < 1:
            raise ValueError(f"demos: {s.label} keeps turns={s.turns}; give at least 1 (or none: all)")
        if s.drill and s.finish:
            raise ValueError(f"demos: {s.label} is both a drill and a finishing source; choose one")
        if labels.count(s.label) > 1:
            raise ValueError(f"demos: {s.label} is listed twice; give it once with the total episodes")
    for env_id in {s.env_id for s in sources}:
        total = sum(s.episodes for s in sources if s.env_id == env_id)
        if total > SEEDS_PER_BUILD:
            raise ValueError(
                f"demos: {total} episodes of {env_id}, more than the {SEEDS_PER_BUILD} seeds of one build"
            )


def source_seeds(
    sources: Sequence[DemoSource], build_seed: int, *, after: Sequence[DemoSource] = ()
) -> list[range]:
    """Each source's env seeds: one env's sources take consecutive slices of its build block.

    So two demonstrators of one env never play the same task. ``after``: sources whose slices
    come first and are skipped (a build that continues another, :attr:`BuildConfig.base
    <srt_agent.recipe.build.BuildConfig.base>`, plays tasks its base never trained on).
    """
    used: dict[str, int] = {}
    for s in after:
        used[s.env_id] = used.get(s.env_id, 0) + s.episodes
    out = []
    for s in sources:
        start = used.get(s.env_id, 0)
        used[s.env_id] = start + s.episodes
        out.append(demo_seeds(start + s.episodes, build_seed)[start:])
    return out


def demo_digest(
    sources: Sequence[DemoSource],
    build_seed: int,
    *,
    read_system: bool,
    per_source: int = 4,
    after: Sequence[DemoSource] = (),
) -> str:
    """A fingerprint of what a build trains on: SHA-256 of each source's first demonstrations.

    Each source plays the first ``per_source`` seeds of its own slice (:func:`source_seeds`), and
    the digest covers their rendered chat text (what the tokenizer is trained on) and which turns
    carry loss. A change to an env, its oracle, a demonstrator or the chat template changes it,
    within seconds, where rebuilding a model to compare its weights takes minutes. ``after`` as
    in :func:`source_seeds`.
    """
    digest = hashlib.sha256()
    for source, seeds in zip(sources, source_seeds(sources, build_seed, after=after), strict=True):
        demos = collect_demos(
            source.env_id,
            0,
            seeds=seeds[:per_source],
            demonstrator=source.demonstrator,
            options=source.options,
            turns=source.turns,
        )
        digest.update(f"{source.label}:{len(demos)}".encode())
        for d in demos:
            digest.update(render_chat(d.messages, d.tools, read_system=read_system).encode())
            digest.update(bytes(t.trained for t in d.turns))
    return digest.hexdigest()


@dataclass(frozen=True)
class DemoTurn:
    """One assistant turn of a demonstration and what the env answered.

    Attributes:
        action: The oracle's text.
        observation: The env's new messages after it (empty after the last turn, whose answer
            would only cost tokens without training anything).
        trained: Whether the turn is a training target (loss mask 1); a demonstrator's deliberate
            mistake is context only, so a model learns the recovery, not the mistake.
    """

    action: str
    observation: tuple[Message, ...]
    trained: bool = True


@dataclass(frozen=True)
class Demo:
    """One solved oracle episode.

    Attributes:
        env_id: The env it was played on.
        seed: The ``reset`` seed.
        opening: The opening messages (system prompt, first user message).
        tools: The tool schemas the env announced on ``reset``.
        turns: The assistant turns with the env's answers.
        total_reward: The episode's total reward.
    """

    env_id: str
    seed: int
    opening: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    turns: tuple[DemoTurn, ...]
    total_reward: float

    def first(self, turns: int) -> Demo:
        """The demonstration cut after its first ``turns`` assistant turns (the last without its answer)."""
        kept = self.turns[:turns]
        if len(kept) == len(self.turns):
            return self
        kept = (*kept[:-1], DemoTurn(kept[-1].action, (), kept[-1].trained))
        return Demo(self.env_id, self.seed, self.opening, self.tools, kept, self.total_reward)

    @property
    def messages(self) -> tuple[Message, ...]:
        """The whole conversation, opening messages first."""
        out = list(self.opening)
        for t in self.turns:
            out.append(Message(role="assistant", content=t.action))
            out.extend(t.observation)
        return tuple(out)


def demo_seeds(count: int, build_seed: int) -> range:
    """The env seeds of ``count`` demonstrations for a build with seed ``build_seed``.

    Raises:
        ValueError: ``count`` exceeds :data:`SEEDS_PER_BUILD` or ``build_seed`` is negative.
    """
    if not 0 <= count <= SEEDS_PER_BUILD:
        raise ValueError(f"count={count} must be in [0, {SEEDS_PER_BUILD}]")
    if build_seed < 0:
        raise ValueError(f"build seed must be >= 0, got {build_seed}")
    start = DEMO_SEED_BASE + build_seed * SEEDS_PER_BUILD
    return range(start, start + count)


def collect_demos(
    env_id: str,
    count: int,
    *,
    build_seed: int = 0,
    seeds: range | None = None,
    demonstrator: str = "oracle",
    options: Mapping[str, Any] | None = None,
    turns: int | None = None,
) -> list[Demo]:
    """Play the env's oracle ``count`` times (seeds from :func:`demo_seeds`), keeping solved episodes.

    Args:
        env_id: A registered env with an oracle.
        count: Episodes to play.
        build_seed: Picks the block of seeds, so different builds see different tasks.
        seeds: Play exactly these env seeds instead (``count`` and ``build_seed`` are then
            ignored): a slice of a build's block, for collecting in parallel.
        demonstrator: Who plays: a key of :data:`DEMONSTRATORS`.
        options: Env options for ``make``.
        turns: Keep only the first ``turns`` assistant turns of each solved episode.

    Returns:
        The solved episodes, in seed order (the built-in oracles solve every task). An episode
        whose env or demonstrator raises is skipped with a warning, and so is one where a
        demonstrator's mistake (its ``mistakes`` turn indexes) drew no correction (a tool error
        for a call, the customer's reply for a message): it shows no recovery.

    Raises:
        NotImplementedError: The env has no oracle.
        TypeError: The env is not a :class:`~srt_agent.env.multi_turn.MultiTurnEnv`.
        ValueError: Unknown demonstrator, or the env has no such demonstrator.
    """
    policy = demonstrator_policy(demonstrator)
    env = make(env_id, **(options or {}))
    inner = env.unwrapped
    if not isinstance(inner, MultiTurnEnv):
        raise TypeError(f"{env_id} is not a MultiTurnEnv ({type(inner).__name__})")
    tools = tuple(inner.tools.schemas())
    demos = []
    made: list[Policy] = []
    try:
        for seed in seeds if seeds is not None else demo_seeds(count, build_seed):
            try:
                result = run_episode(env, partial(_demonstrator, policy, made), seed=seed)
            except _UnusableDemonstrator as exc:  # a configuration error: no task would do better
                raise exc.cause from None
            except Exception as exc:  # noqa: BLE001 - one broken task must not cost the build its demos
                log.warning("demo of %s seed %d skipped: %s", env_id, seed, describe_fault(exc))
                continue
            if not inner.is_success(result.total_reward, result.final_info):
                continue
            demo = _to_demo(env_id, seed, result.transcript, tools, result.total_reward, _mistakes(made[-1]))
            if demo is None:
                continue
            demos.append(demo if turns is None else demo.first(turns))
    finally:
        env.close()
    return demos


class _UnusableDemonstrator(Exception):
    """The demonstrator cannot play this env (raised while making its policy, not by a task)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _demonstrator(
    make_policy: Callable[[gym.Env[Observation, str]], Policy],
    made: list[Policy],
    env: gym.Env[Observation, str],
) -> Policy:
    try:
        policy = make_policy(env)
    except Exception as exc:
        raise _UnusableDemonstrator(exc) from exc
    made[:] = [policy]
    return policy


def _mistakes(policy: Policy) -> frozenset[int]:
    """The assistant turns a demonstrator made wrong on purpose (none for an oracle)."""
    return frozenset(getattr(policy, "mistakes", ()))


def _corrects(action: str, reply: Message) -> bool:
    """Whether ``reply`` answers a mistaken ``action``: a tool error for a call, the customer for text."""
    if parse_tool_calls(action).has_calls:
        return is_error_message(reply)
    return reply.role == "user"


def _to_demo(
    env_id: str,
    seed: int,
    transcript: Sequence[Message],
    tools: tuple[dict[str, Any], ...],
    reward: float,
    mistakes: frozenset[int] = frozenset(),
) -> Demo | None:
    """The episode as a demonstration, its ``mistakes`` untrained; ``None`` if one drew no correction.

    A mistaken call must have drawn a tool error and a mistaken message the customer's reply
    (otherwise the "mistake" went unnoticed, and the demonstration would show no recovery).
    """
    first = next(i for i, m in enumerate(transcript) if m.role == "assistant")
    pairs: list[tuple[str, list[Message]]] = []
    for m in transcript[first:]:
        if m.role == "assistant":
            pairs.append((m.content, []))
        else:
            pairs[-1][1].append(m)
    if any(i >= len(pairs) or not any(_corrects(pairs[i][0], m) for m in pairs[i][1]) for i in mistakes):
        return None
    last = len(pairs) - 1
    turns = tuple(
        DemoTurn(a, tuple(obs) if i < last else (), i not in mistakes) for i, (a, obs) in enumerate(pairs)
    )
    return Demo(env_id, seed, tuple(transcript[:first]), tools, turns, reward)


def demo_texts(demos: Sequence[Demo], *, read_system: bool = True) -> Iterator[str]:
    """Each demonstration rendered with the chat template, for training the tokenizer."""
    for d in demos:
        yield render_chat(d.messages, d.tools, read_system=read_system)


def to_transcript(fmt: ChatFormat, demo: Demo) -> TokenTranscript:
    """The demonstration as one token sequence, built turn by turn exactly as a rollout would be.

    Assistant turns are tokenized and closed with the end-of-turn token, then appended as if the
    policy had sampled them (loss mask 1, or 0 for an untrained mistake); everything else is
    rendered by the template (mask 0). ChatFormat checks at every turn that the template is
    append-only.
    """
    tr = fmt.start(demo.opening, demo.tools)
    eot = fmt.stop_token_ids[0]
    for turn in demo.turns:
        ids = [*fmt.encode(turn.action), eot]
        tr = fmt.add_generation(tr, ids, [0.0] * len(ids))
        if not turn.trained:
            tr = replace(tr, loss_mask=(*tr.loss_mask[: -len(ids)], *(0,) * len(ids)))
        if turn.observation:
            tr = fmt.add_observation(tr, turn.observation)
    return tr

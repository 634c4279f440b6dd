"""reasoning-gym datasets as srt-agent envs: ``reasoning_gym:<dataset>``.

Install with ``pip install 'srt-agent[reasoning-gym]'``.

Every procedural dataset of reasoning-gym (``reasoning_gym.factory.DATASETS``) plays as tasks:

* ``reset(seed=s)`` plays entry ``s % size`` of the dataset built with ``dataset_seed`` and
  ``dataset_options`` (the dataset's own config: difficulty and so on), so distinct seeds below
  ``size`` are distinct tasks and eval seeds never meet training seeds; ``reset(options={"index":
  i})`` plays entry ``i``. The task id is ``reasoning_gym/<dataset>/<dataset_seed>/<index>``.
* The opening is a system prompt asking for the answer in ``<answer>...</answer>`` (reasoning-gym's
  own default prompt; with a tool, srt-agent's prompt for it: ``srt/Calculator-v0``'s for the
  calculator) and the entry's ``question``.
* ``tool``: ``none`` (one turn: the reply is scored), ``calculator`` or ``python`` (srt-agent's
  tools; turns with tool calls get the results back, a turn without tool calls or an answer gets
  a reminder, until ``max_turns``).
* Reward: the dataset's own ``score_answer`` on the answer tag's content, in ``[0, 1]`` (many
  datasets give partial credit); the episode counts as solved at ``success_threshold`` (1.0). A
  ``score_answer`` that raises on the model's answer (``prime_factorization``'s does on text)
  scores 0 with the error in ``info["score_error"]``; one that returns something other than a
  number in ``[0, 1]`` fails the episode with the reason.
* Oracles (for demonstrations and tests): ``oracle()`` answers with the entry's reference answer,
  after one calculator call on the entry's arithmetic expression in calculator mode when it has one;
  ``mental_oracle()`` answers at once.

All of reasoning-gym's datasets are generated offline (a few need extra packages of their own).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from srt_agent.chat.messages import Message, system, user
from srt_agent.env.episode_loop import Policy
from srt_agent.env.multi_turn import Transition
from srt_agent.env.registration import UnknownEnvError, register_env
from srt_agent.errors import describe_fault
from srt_agent.integrations.ecosystems.foreign import (
    ForeignEnv,
    ForeignEnvConfig,
    ForeignEnvError,
    ReplyPolicy,
    foreign_reward,
    import_package,
    reraise_foreign,
)
from srt_agent.tooling.parser import format_tool_call
from srt_agent.tooling.toolset import ToolSet

__all__ = ["CalculateThenAnswer", "ReasoningGymConfig", "ReasoningGymEnv", "register"]

NAMESPACE = "reasoning_gym"

TOOL_PROMPT = """You solve problems step by step with a {tool} tool.
Call it by writing, for example:
{example}
Its result comes back in the next message. Make one or more {tool} calls per turn and use the results \
in later steps.
When you have the final result, reply with just the answer inside answer tags, for example \
<answer>42</answer>."""

_EXAMPLES = {"python": format_tool_call("python", {"code": "print((12 + 7) * 3.5)"})}

NUDGE = (
    "Please continue: call the {tool} tool for the next step, or give the final result as "
    "<answer>ANSWER</answer>."
)


class ReasoningGymConfig(ForeignEnvConfig):
    """Options of a reasoning-gym env (``gymnasium.make("reasoning_gym:<dataset>", **options)``)."""

    dataset: str = Field(description="The reasoning-gym dataset (reasoning_gym.factory.DATASETS).")
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="The dataset's own config (e.g. min_terms, max_digits)."
    )
    dataset_seed: int = Field(0, ge=0, description="Seed of the dataset's generator.")
    size: int = Field(
        1_000_000_000,
        ge=1,
        le=2**62,
        description="Entries: reset(seed=s) plays entry s % size (entries are generated when read).",
    )
    tool: Literal["none", "calculator", "python"] = Field(
        "none", description="none: one turn, scored; calculator or python: a tool and a multi-turn episode."
    )
    system_prompt: str | None = Field(None, description="Replaces the default system prompt.")


@functools.lru_cache(maxsize=32)
def _dataset(name: str, options_json: str, seed: int, size: int) -> Any:
    """The dataset, built once per process (generation is lazy: entries are made when read)."""
    rg = import_package("reasoning_gym", "reasoning-gym", "reasoning-gym")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **json.loads(options_json))
    except Exception as exc:
        raise reraise_foreign(exc, f"reasoning-gym dataset {name!r} (options {options_json})") from exc


class ReasoningGymEnv(ForeignEnv):
    """A reasoning-gym dataset's entries as tasks, scored by the dataset's own ``score_answer``.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`ReasoningGymConfig` options.
    """

    config_model = ReasoningGymConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: ReasoningGymConfig
        cfg = self.config
        self.data = _dataset(
            cfg.dataset, json.dumps(cfg.dataset_options, sort_keys=True), cfg.dataset_seed, cfg.size
        )
        self._entry: dict[str, Any] | None = None

    def build_tools(self) -> ToolSet:
        """srt-agent's ``calculator`` or ``python`` tool, or none."""
        tool = self.config.tool
        if tool == "calculator":
            from srt_agent.tools.calculator import calculator

            return ToolSet([calculator])
        if tool == "python":
            from srt_agent.tools.python import python

            return ToolSet([python])
        return ToolSet()

    @property
    def entry(self) -> dict[str, Any]:
        """The current entry (``question``, ``answer``, ``metadata``)."""
        if self._entry is None:
            raise RuntimeError("ReasoningGymEnv: no task yet; call reset() first")
        return self._entry

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """The entry of the reset seed (or ``options["index"]``), as a system prompt and a question."""
        cfg = self.config
        unknown = sorted(set(options) - {"index"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; reasoning-gym envs take 'index'")
        index = int(options["index"]) if "index" in options else self.task_seed(cfg.size) % cfg.size
        if not 0 <= index < cfg.size:
            raise ValueError(f"index {index} is outside the dataset's {cfg.size} entries")
        try:
            entry = self.data[index]
        except Exception as exc:
            raise reraise_foreign(exc, f"reasoning-gym dataset {cfg.dataset!r} entry {index}") from exc
        if not isinstance(entry, dict) or not isinstance(entry.get("question"), str):
            raise ForeignEnvError(
                f"reasoning-gym dataset {cfg.dataset!r} entry {index} has no question string: "
                f"{str(entry)[:200]}"
            )
        self._entry = entry
        task_id = f"{NAMESPACE}/{cfg.dataset}/{cfg.dataset_seed}/{index}"
        return task_id, [system(self._system_prompt()), user(entry["question"])]

    def _system_prompt(self) -> str:
        cfg = self.config
        if cfg.system_prompt is not None:
            return cfg.system_prompt
        if cfg.tool == "calculator":  # srt-agent's own calculator prompt, as srt/Calculator-v0 words it
            from srt_agent.envs.calculator import SYSTEM_PROMPT

            return SYSTEM_PROMPT
        if cfg.tool != "none":
            return TOOL_PROMPT.format(tool=cfg.tool, example=_EXAMPLES[cfg.tool])
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return str(SYSTEM_PROMPTS["default"])

    def on_message(self, text: str) -> Transition:
        """Score the answer tag's content with the dataset's ``score_answer``; remind once in tool mode."""
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(text)
        if answer is None and self.config.tool != "none":
            return Transition(messages=[user(NUDGE.format(tool=self.config.tool))])
        info: dict[str, Any] = {"answer": answer, "expected": str(self.entry.get("answer"))}
        try:
            score = _score(self.data.score_answer(answer, self.entry), self.config.dataset)
        except ForeignEnvError:
            raise
        except Exception as exc:  # noqa: BLE001 - some scorers raise on unreadable answers
            score, info["score_error"] = 0.0, describe_fault(exc)[:300]
        info["score"] = score
        return Transition(reward=score, terminated=True, info=info)

    def oracle(self) -> Policy:
        """The reference answer in answer tags; with the calculator, computed by the tool first.

        In calculator mode, an entry whose metadata carries the arithmetic ``expression`` (as
        ``basic_arithmetic``'s and ``chain_sum``'s do) is solved as a tool user would: one calculator
        call on it, then the answer. Any other entry is answered at once.
        """
        expression = (self.entry.get("metadata") or {}).get("expression")
        if self.config.tool == "calculator" and isinstance(expression, str) and expression.strip():
            return CalculateThenAnswer(expression, self._answer())
        return ReplyPolicy(self._answer())

    def mental_oracle(self) -> Policy:
        """The reference answer in answer tags at once, without a tool (a build's second demonstrator)."""
        return ReplyPolicy(self._answer())

    def _answer(self) -> str:
        return f"<answer>{self.entry['answer']}</answer>"


@dataclass(frozen=True)
class CalculateThenAnswer:
    """Calls the calculator on ``expression``, then replies ``answer`` once a tool result is back."""

    expression: str
    answer: str

    def act(self, history: Sequence[Message]) -> str:
        """The calculator call, or the answer after the tool has answered."""
        if any(m.role == "tool" for m in history):
            return self.answer
        return format_tool_call("calculator", {"expression": self.expression})


def _score(raw: Any, dataset: str) -> float:
    """``score_answer``'s value as a reward, or :class:`ForeignEnvError` if it is not one."""
    score = foreign_reward(raw, f"reasoning-gym {dataset!r} score_answer")
    if not 0.0 <= score <= 1.0:
        raise ForeignEnvError(f"reasoning-gym {dataset!r} score_answer returned {score}, outside [0, 1]")
    return score


def register(name: str) -> str:
    """Register ``reasoning_gym:<name>``; its Gymnasium id (``reasoning_gym/<name>``).

    Raises:
        UnknownEnvError: reasoning-gym is not installed, or has no dataset ``name``.
    """
    import_package("reasoning_gym", "reasoning-gym", "reasoning-gym")
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"reasoning-gym has no dataset {name!r}.{hint} It has {len(DATASETS)}: "
            f"{', '.join(sorted(DATASETS)[:12])}, ... (reasoning_gym.factory.DATASETS lists them)"
        )
    env_id = f"{NAMESPACE}/{name}"
    register_env(env_id, ReasoningGymEnv, dataset=name)
    return env_id

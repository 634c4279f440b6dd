"""The multi-turn environment contract: a real ``gymnasium.Env`` over chat messages.

* observation: a tuple of :class:`~srt_agent.chat.messages.Message`, the messages that are new since the
  previous step (opening system/user messages on ``reset``; tool results or the user's reply after
  a step);
* action: the assistant's text for one turn (tool calls inside it in the Hermes format);
* ``reset(seed, options)`` returns the opening messages and ``info`` with ``task_id`` and ``tools``
  (JSON schemas); ``step`` returns ``(obs, reward, terminated, truncated, info)``.

A subclass describes its task with three methods (:meth:`MultiTurnEnv.new_task`,
:meth:`MultiTurnEnv.on_message`, optionally :meth:`MultiTurnEnv.on_tool_results`) and its tools with
:meth:`MultiTurnEnv.build_tools`; the base class parses tool calls, runs them with timeouts, counts
turns, truncates at ``max_turns`` and keeps the transcript.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, SupportsFloat

import gymnasium as gym
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo

from srt_agent.chat.messages import Message, assistant, format_transcript
from srt_agent.env.spaces import AnyText, MessagesSpace
from srt_agent.errors import SrtAgentError
from srt_agent.tooling.parser import MalformedCall, ParsedTurn, parse_tool_calls
from srt_agent.tooling.toolset import ToolResult, ToolSet

if TYPE_CHECKING:
    from srt_agent.env.episode_loop import Policy

Observation = tuple[Message, ...]


class EnvConfig(BaseModel):
    """Options every multi-turn env accepts (``gymnasium.make(id, **options)``).

    Subclass it to add an env's own options; unknown keys are rejected with the list of valid ones.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(16, ge=1, le=1000, description="Assistant turns before the episode is truncated.")
    max_action_chars: int = Field(
        32_000,
        ge=1,
        description="Longest assistant turn accepted, in characters; a longer one runs nothing and gets an "
        "error message back.",
    )
    max_tool_calls: int = Field(
        16, ge=1, le=1000, description="Tool calls of one turn that run; later ones get an error back."
    )


class EnvConfigError(SrtAgentError, ValueError):
    """Bad options were passed to an env's constructor (e.g. via ``gymnasium.make``)."""


def not_below(value: int, info: ValidationInfo, low_field: str) -> int:
    """``value`` if it is at least the option ``low_field`` (validated before it), else a ``ValueError``.

    For an option pair such as ``min_steps``/``max_steps``: call it from the upper option's
    ``field_validator``; the message names both options and both values.
    """
    low = info.data.get(low_field)
    if low is not None and value < low:
        raise ValueError(f"{info.field_name} ({value}) must be >= {low_field} ({low})")
    return value


def describe_options(model: type[BaseModel]) -> str:
    """One line per option of a config model: name, type, default, description."""
    lines = []
    for name, f in model.model_fields.items():
        ann = getattr(f.annotation, "__name__", str(f.annotation))
        desc = f" - {f.description}" if f.description else ""
        lines.append(f"  {name}: {ann} = {f.default!r}{desc}")
    return "\n".join(lines)


def validate_config(env_cls: type[MultiTurnEnv], options: Mapping[str, Any]) -> EnvConfig:
    """``options`` as ``env_cls``'s config model; :class:`EnvConfigError` listing valid options if not."""
    model = env_cls.config_model
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {key!r}")
            else:
                problems.append(f"option {key!r}={err.get('input')!r}: {err['msg']}")
        raise EnvConfigError(
            f"{env_cls.__name__}: " + "; ".join(problems) + f"\nValid options:\n{describe_options(model)}"
        ) from None


@dataclass(frozen=True)
class Transition:
    """What the env answers to one assistant turn (returned by the subclass hooks).

    Attributes:
        messages: New messages for the model (the user's reply, tool results, feedback).
        reward: Reward for this turn.
        terminated: The task reached a terminal state.
        info: Extra step info (merged into ``step``'s info dict).
    """

    messages: Sequence[Message] = ()
    reward: float = 0.0
    terminated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class MultiTurnEnv(gym.Env[Observation, str]):
    """Base class of multi-turn, tool-using chat environments.

    Subclasses set ``config_model`` (a subclass of :class:`EnvConfig`) and implement
    :meth:`new_task` and :meth:`on_message`; tool-using envs also implement :meth:`build_tools`,
    and may override :meth:`on_tool_results` and :meth:`oracle`. All randomness must come from
    ``self.np_random`` (seeded by ``reset(seed=...)``).

    Args:
        render_mode: ``None`` or ``"ansi"`` (``render()`` returns the transcript as text).
        **options: Validated against ``config_model``; available as ``self.config``.

    Raises:
        EnvConfigError: Unknown option or bad value, with the list of valid options.
    """

    # render_fps only silences gymnasium's checker: a transcript has no frame rate.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 - gymnasium API
    config_model: ClassVar[type[EnvConfig]] = EnvConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        self.config = validate_config(type(self), options)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise EnvConfigError(
                f"{type(self).__name__}: render_mode={render_mode!r} is not supported; "
                f"choose one of {self.metadata['render_modes']} or None"
            )
        self.render_mode = render_mode
        self.observation_space = MessagesSpace()
        self.action_space = AnyText(max_length=self.config.max_action_chars)
        self.tools: ToolSet = self.build_tools()
        self.tools.max_calls_per_turn = self.config.max_tool_calls
        self._transcript: list[Message] = []
        self._turn = 0
        self._done = True
        self._task_id = ""
        self._oracle_turns: int | None = None

    # ------------------------------------------------------------------ subclass hooks
    def build_tools(self) -> ToolSet:
        """The env's tools (called once, in ``__init__``). No tools by default."""
        return ToolSet()

    @abstractmethod
    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """Start a new task, drawing all randomness from ``self.np_random``.

        Args:
            options: The ``options`` passed to ``reset`` (empty dict if none).

        Returns:
            The task id and the opening messages.
        """

    @abstractmethod
    def on_message(self, text: str) -> Transition:
        """React to an assistant turn that contains no tool call (a reply or a final answer)."""

    def on_tool_results(self, turn: ParsedTurn, results: list[ToolResult]) -> Transition:
        """React to a turn with tool calls, after they ran. Default: return the results, reward 0."""
        return Transition(messages=[r.to_message() for r in results])

    def on_truncation(self) -> Transition:
        """Reward and info for an episode the turn limit ends (called after that turn's own hook).

        Default: nothing (an unfinished task earns no reward). Envs with partial credit override
        it; messages in the returned transition are ignored (the episode is over).
        """
        return Transition()

    def is_success(self, total_reward: float, info: dict[str, Any]) -> bool:
        """Whether a finished episode counts as solved (for success rates and pass^k).

        Default: the total reward reached 1 (the built-in envs' maximum). Envs with shaped rewards
        override it.

        Args:
            total_reward: Sum of the episode's rewards.
            info: The last step's info.
        """
        return total_reward >= 1.0 - 1e-9

    def oracle(self) -> Policy:
        """A scripted policy that solves the current task (built after ``reset``).

        Raises:
            NotImplementedError: This env ships no oracle.
        """
        raise NotImplementedError(f"{type(self).__name__} does not provide an oracle policy")

    # ------------------------------------------------------------------ gymnasium API
    @property
    def transcript(self) -> tuple[Message, ...]:
        """Every message of the current episode so far, assistant turns included."""
        return tuple(self._transcript)

    @property
    def turn(self) -> int:
        """Assistant turns taken in the current episode."""
        return self._turn

    @property
    def task_id(self) -> str:
        """Id of the current task."""
        return self._task_id

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        """Start a new episode; see the module docstring for the returned values.

        The reset option ``oracle_prefix`` (a share in [0, 1]) starts the episode part-way through
        the task: the env's :meth:`oracle` first plays the share ``oracle_prefix`` of its solution's
        turns (at most all but its last), and the observation is the whole conversation so far,
        the oracle's turns included; ``info["oracle_turns"]`` says how many. A training curriculum
        uses it to let a policy learn a task's end before its start (reverse curriculum). The
        other options go to :meth:`new_task`.

        Raises:
            ValueError: ``oracle_prefix`` outside [0, 1].
            NotImplementedError: ``oracle_prefix`` on an env without an oracle.
        """
        opts = dict(options or {})
        prefix = opts.pop("oracle_prefix", None)
        if prefix is not None and (
            isinstance(prefix, bool) or not isinstance(prefix, int | float) or not 0 <= prefix <= 1
        ):
            raise ValueError(f"reset option oracle_prefix={prefix!r}: expected a share in [0, 1]")
        if not prefix:
            opening = self._start(seed, opts)
        else:
            if seed is None:  # both plays below must draw the same task
                seed = int(self.np_random.integers(2**31))
            solution = self._oracle_solution(seed, opts)
            k = min(int(prefix * len(solution)), len(solution) - 1)
            opening = self._start(seed, opts)
            for action in solution[:k]:
                self.step(action)
            opening = tuple(self._transcript)
        self._oracle_turns = None if prefix is None else self._turn
        info = {
            "task_id": self._task_id,
            "tools": self.tools.schemas(),
            "max_turns": self.config.max_turns,
            **self.task_info(),
        }
        if self._oracle_turns is not None:
            info["oracle_turns"] = self._oracle_turns
        return opening, info

    def _start(self, seed: int | None, options: dict[str, Any]) -> Observation:
        super().reset(seed=seed)
        task_id, opening = self.new_task(options)
        self._task_id = task_id
        self._transcript = list(opening)
        self._turn = 0
        self._done = False
        return tuple(opening)

    def _oracle_solution(self, seed: int, options: dict[str, Any]) -> list[str]:
        """The oracle's turns on the task ``seed`` draws (played to its end, then discarded)."""
        from srt_agent.env.episode_loop import run_episode

        played = run_episode(self, lambda env: self.oracle(), seed=seed, options=options)
        return [m.content for m in played.transcript if m.role == "assistant"]

    def task_info(self) -> dict[str, Any]:
        """Facts about the current task that ``reset``'s and every step's ``info`` carry.

        Override to label tasks: a ``task_kind`` entry gives ``srt-agent eval`` and training
        metrics their per-kind figures. The default labels nothing.
        """
        return {}

    def _parse(self, action: str) -> ParsedTurn:
        if self._done:
            raise RuntimeError(f"{type(self).__name__}: the episode is over; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"action must be the assistant's text (str), got {type(action).__name__}")
        self._turn += 1
        self._transcript.append(assistant(action))
        limit = self.config.max_action_chars
        if len(action) > limit:  # not parsed, nothing run: the model is told why, and the episode goes on
            reason = (
                f"the message is {len(action)} characters, over this environment's limit of {limit}; "
                "nothing in it was run"
            )
            bad = MalformedCall(id=f"t{self._turn}_call_0", raw=action[:200], reason=reason)
            return ParsedTurn(text="", errors=(bad,))
        return parse_tool_calls(action, id_prefix=f"t{self._turn}_")

    def _finish_step(
        self, tr: Transition, results: list[ToolResult]
    ) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        msgs = tuple(tr.messages)
        self._transcript.extend(msgs)
        truncated = not tr.terminated and self._turn >= self.config.max_turns
        self._done = tr.terminated or truncated
        if truncated:
            end = self.on_truncation()
            tr = Transition(messages=msgs, reward=tr.reward + end.reward, info={**tr.info, **end.info})
        info: dict[str, Any] = {
            "task_id": self._task_id,
            "turn": self._turn,
            "tool_calls": len(results),
            "tool_errors": [r.error for r in results if r.error is not None],
            **self.task_info(),
        }
        if truncated:
            info["truncation_reason"] = f"max_turns={self.config.max_turns} reached"
        if self._oracle_turns is not None:
            info["oracle_turns"] = self._oracle_turns
        info.update(tr.info)
        return msgs, float(tr.reward), bool(tr.terminated), truncated, info

    def step(self, action: str) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply one assistant turn: run its tool calls, or hand its text to :meth:`on_message`."""
        turn = self._parse(action)
        if turn.has_calls:
            results = self.tools.execute(turn)
            return self._finish_step(self.on_tool_results(turn, results), results)
        return self._finish_step(self.on_message(action), [])

    async def astep(self, action: str) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """Async :meth:`step`: tool calls run on the event loop (I/O overlaps other episodes).

        The env's own logic runs in a worker thread. A subclass that overrides :meth:`step` but not
        this method gets its ``step`` run in a worker thread instead, so both stay consistent.
        """
        if type(self).step is not MultiTurnEnv.step:
            return await asyncio.to_thread(self.step, action)
        turn = self._parse(action)
        if turn.has_calls:
            results = await self.tools.aexecute(turn)
            tr = await asyncio.to_thread(self.on_tool_results, turn, results)
            return self._finish_step(tr, results)
        return self._finish_step(await asyncio.to_thread(self.on_message, action), [])

    def render(self) -> str | None:
        """The transcript as text in ``"ansi"`` mode; ``None`` otherwise."""
        if self.render_mode == "ansi":
            return format_transcript(self._transcript) + "\n"
        return None


_PASSIVE_WRAPPERS = ("PassiveEnvChecker", "OrderEnforcing")


async def async_step(
    env: gym.Env[Observation, str], action: str
) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
    """Step any env without blocking the event loop.

    Uses the env's native :meth:`MultiTurnEnv.astep` when the only wrappers are the passive ones
    ``gymnasium.make`` adds (checker, order enforcing: they do nothing after the first step);
    otherwise runs the wrapped ``step`` in a worker thread so every wrapper still applies.
    """
    inner: gym.Env[Any, Any] = env
    while isinstance(inner, gym.Wrapper):
        if type(inner).__name__ not in _PASSIVE_WRAPPERS:
            return await asyncio.to_thread(env.step, action)
        inner = inner.env
    if isinstance(inner, MultiTurnEnv):
        return await inner.astep(action)
    return await asyncio.to_thread(env.step, action)


def oracle_policy(env: gym.Env[Observation, str]) -> Policy:
    """The oracle of the (possibly wrapped) env's current task; call after ``reset``.

    Raises:
        TypeError: The env is not a :class:`MultiTurnEnv`.
        NotImplementedError: The env has no oracle.
    """
    inner = env.unwrapped
    if not isinstance(inner, MultiTurnEnv):
        raise TypeError(f"oracle_policy needs a MultiTurnEnv, got {type(inner).__name__}")
    return inner.oracle()

"""verifiers environments as srt-agent envs: ``verifiers:<environment module>``.

Install with ``pip install 'srt-agent[verifiers]'``.

Written against verifiers 0.3.1, the last release of the API most published environments use
(``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``, ``vf.Rubric``, ``load_environment``);
0.4.0 keeps only ``verifiers.v1``, whose harnesses run the model loop in a separate program, and
cannot load those environments. How an environment plays:

* The environment is ``vf.load_environment(<module>, **env_args)`` (an installed module, or one in
  the current directory, with a ``load_environment`` function), built once per process.
* ``reset(seed=s)`` plays row ``s % len(dataset)`` of its ``dataset`` (``split: eval``: its
  ``eval_dataset``); ``options={"index": i}`` plays row ``i``. The task id is
  ``verifiers/<module>/<split>/<example_id>``. The opening is the row's prompt (system prompt and
  few-shot examples included, as verifiers formats it).
* Each assistant turn goes to verifiers as its model's reply: tool calls (srt-agent's Hermes
  syntax, parsed here) become the message's ``tool_calls``, which a ``ToolEnv`` runs itself; then
  the environment's stop conditions are checked, and its ``env_response`` (the user's reply, the
  tool results) is the next observation. ``final_env_response`` ends the episode with it.
* At the end the rubric scores the rollout (``score_rollout``): the reward is its weighted sum, and
  each criterion's score is in ``info["verifiers_metrics"]``; the episode counts as solved at
  ``success_threshold``.

An environment that raises (in ``setup_state``, ``env_response``, a stop condition), returns
something malformed, or needs a group rubric fails its episode with the reason. Environments whose
data comes from the Hugging Face hub, or whose rubric calls an OpenAI judge, need a network.
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal, SupportsFloat

from pydantic import Field

from srt_agent.chat.messages import Message, tool_result
from srt_agent.env.multi_turn import Observation, Transition
from srt_agent.env.registration import UnknownEnvError, register_env, search_current_dir
from srt_agent.integrations.ecosystems.foreign import (
    ForeignEnv,
    ForeignEnvConfig,
    ForeignEnvError,
    LoopThread,
    foreign_reward,
    import_package,
    reraise_foreign,
)
from srt_agent.tooling.toolset import ToolSet

__all__ = ["VerifiersConfig", "VerifiersEnv", "register"]

NAMESPACE = "verifiers"

_LOADED: dict[str, Any] = {}
_LOAD_LOCK = threading.Lock()


class VerifiersConfig(ForeignEnvConfig):
    """Options of a verifiers environment (``gymnasium.make("verifiers:<module>", **options)``)."""

    environment: str = Field(
        description="The module whose load_environment builds it (vf.load_environment's id)."
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of load_environment."
    )
    split: Literal["train", "eval"] = Field(
        "train", description="Rows of dataset (train) or eval_dataset (eval)."
    )


def _vf() -> Any:
    return import_package("verifiers", "verifiers", "verifiers")


@contextmanager
def _signals_allowed() -> Iterator[None]:
    """Let verifiers build an environment off the main thread.

    Its constructor installs signal handlers, which Python allows on the main thread only:
    elsewhere the call is skipped.
    """
    if threading.current_thread() is threading.main_thread():
        yield
        return
    original = signal.signal
    signal.signal = lambda signum, handler: signal.getsignal(signum)  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = original


def load(environment: str, env_args: dict[str, Any]) -> Any:
    """``vf.load_environment(environment, **env_args)``, once per process and arguments."""
    key = json.dumps([environment, env_args], sort_keys=True, default=str)
    with _LOAD_LOCK:
        if key not in _LOADED:
            vf = _vf()
            search_current_dir()
            try:
                with _signals_allowed():
                    _LOADED[key] = vf.load_environment(environment, **env_args)
            except Exception as exc:
                raise reraise_foreign(
                    exc, f"verifiers environment {environment!r} (load_environment)"
                ) from exc
        return _LOADED[key]


@functools.cache
def _no_client_class() -> Any:
    """The ``vf.Client`` class that ``init_state`` requires, defined once on first use.

    srt-agent's engine is the model here, so the client is never asked for a response.
    """
    vf = _vf()

    class NoClient(vf.Client):  # type: ignore[misc, name-defined]
        def setup_client(self, config: Any) -> None:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> Any:
            return messages, {}

        async def get_native_response(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("srt-agent generates the assistant turns; this client is never asked")

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return NoClient


class VerifiersEnv(ForeignEnv):
    """A verifiers environment: its rows as tasks, ``env_response`` as the other side, the rubric's reward.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`VerifiersConfig` options.
    """

    config_model = VerifiersConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: VerifiersConfig
        cfg = self.config
        self.vf_env = load(cfg.environment, cfg.env_args)
        if getattr(self.vf_env, "requires_group_rollouts", False):
            raise ForeignEnvError(
                f"verifiers environment {cfg.environment!r} scores groups of rollouts together (a group "
                "rubric); srt-agent scores each episode alone"
            )
        try:
            self.rows = self.vf_env.get_eval_dataset() if cfg.split == "eval" else self.vf_env.get_dataset()
        except Exception as exc:
            raise reraise_foreign(
                exc, f"verifiers environment {cfg.environment!r} ({cfg.split} rows)"
            ) from exc
        if len(self.rows) == 0:
            raise ForeignEnvError(f"verifiers environment {cfg.environment!r} has no {cfg.split} rows")
        self._loop = LoopThread(f"verifiers-{cfg.environment}")
        self._client = _no_client_class()(None)
        self._state: Any = None
        self._prompt: list[Any] = []
        self._call_names: dict[str, str] = {}

    # ------------------------------------------------------------------ set-up
    def build_tools(self) -> ToolSet:
        """None of srt-agent's: a ``ToolEnv``'s tools run inside verifiers (see :meth:`tool_schemas`)."""
        return ToolSet()

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The environment's tools as OpenAI/Hermes function schemas (what the chat template shows)."""
        defs = getattr(self.vf_env, "tool_defs", None) or []
        return [
            {
                "type": "function",
                "function": {
                    "name": d.name,
                    "description": d.description or "",
                    "parameters": dict(d.parameters),
                },
            }
            for d in defs
        ]

    def _run(self, coro: Any, what: str) -> Any:
        try:
            return self._loop.run(coro, self.config.call_timeout_s)
        except ForeignEnvError:
            raise
        except Exception as exc:
            raise reraise_foreign(exc, f"verifiers environment {self.config.environment!r} {what}") from exc

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[Message, ...], dict[str, Any]]:
        """Start the row of ``seed``; ``info["tools"]`` lists the environment's tools."""
        opening, info = super().reset(seed=seed, options=options)
        info["tools"] = self.tool_schemas()
        return opening, info

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """The row's prompt, after the environment's ``init_state`` and ``setup_state``."""
        unknown = sorted(set(options) - {"index"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; verifiers envs take 'index'")
        n = len(self.rows)
        index = int(options["index"]) if "index" in options else self.task_seed(n) % n
        if not 0 <= index < n:
            raise ValueError(f"index {index} is outside the {n} rows")
        row = dict(self.rows[index])
        if isinstance(row.get("task"), str):  # older datasets name a task route; 0.3.1 refuses those
            row.pop("task")
        env = self.vf_env
        state = self._run(env.init_state(row, self._client, "srt-agent", sampling_args={}), "init_state")
        state = self._run(env.setup_state(state), "setup_state") or state
        self._state = state
        self._call_names = {}
        prompt = self._run(env.get_prompt_messages(state), "get_prompt_messages")
        self._prompt = list(prompt)
        example = row.get("example_id", index)
        task_id = f"{NAMESPACE}/{self.config.environment}/{self.config.split}/{example}"
        return task_id, [self._to_srt(m) for m in prompt]

    # ------------------------------------------------------------------ turns
    def step(self, action: str) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """Hand the turn to verifiers as its model's reply; its answer, or the rubric's reward at the end."""
        turn = self._parse(action)
        _vf()
        from verifiers.types import Response, ResponseMessage, ToolCall

        env, state = self.vf_env, self._state
        calls = [
            ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments))
            for c in sorted(turn.calls, key=lambda c: c.id)
        ]
        self._call_names.update({c.id: c.name for c in turn.calls})
        errors = [
            tool_result(f"Error (malformed): {e.reason}", call_id=e.id, name="invalid") for e in turn.errors
        ]
        content = turn.text if (calls or errors) else action
        response = Response(
            id=uuid.uuid4().hex,
            created=int(time.time()),
            model="srt-agent",
            message=ResponseMessage(
                content=content,
                tool_calls=calls or None,
                finish_reason="tool_calls" if calls else "stop",
                is_truncated=False,
                tokens=None,
            ),
        )
        self._run(env.add_model_response(state, self._prompt, response), "add_model_response")
        sent = len(self._prompt) + 1  # the prompt and this reply
        if not self._run(env.is_completed(state), "stop conditions"):
            prompt = list(self._run(env.get_prompt_messages(state), "env_response"))
            self._check_error(state)
            new = [self._to_srt(m) for m in prompt[sent:]]
            self._prompt = prompt
            if state.get("final_env_response") is None:
                return self._counted(Transition(messages=[*errors, *new]), len(calls) + len(errors))
            self._run(env.is_completed(state), "stop conditions")
            return self._counted(self._scored([*errors, *new]), len(calls) + len(errors))
        return self._counted(self._scored(errors), len(calls) + len(errors))

    def _counted(
        self, tr: Transition, calls: int
    ) -> tuple[Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """Finish the step, counting the tool calls verifiers ran (srt-agent's own toolset ran none)."""
        return self._finish_step(replace(tr, info={**tr.info, "tool_calls": calls}), [])

    def on_message(self, text: str) -> Transition:  # pragma: no cover - step() handles every turn
        """Not used: :meth:`step` hands every turn to verifiers."""
        raise NotImplementedError("VerifiersEnv handles turns in step()")

    def _check_error(self, state: Any) -> None:
        error = state.get("error")
        if error is not None:
            raise ForeignEnvError(f"verifiers environment {self.config.environment!r} raised: {error!r}")

    def _scored(self, messages: list[Message]) -> Transition:
        """The episode's end: the rubric's reward, its criteria in ``info``."""
        env, state = self.vf_env, self._state
        self._check_error(state)
        self._run(env.cleanup(state), "cleanup")
        self._run(env.rubric.score_rollout(state), "rubric")
        self._run(env.rubric.cleanup(state), "rubric cleanup")
        reward = foreign_reward(
            state.get("reward"), f"verifiers environment {self.config.environment!r}: the rubric's reward"
        )
        metrics = {
            str(k): float(v) for k, v in (state.get("metrics") or {}).items() if isinstance(v, int | float)
        }
        info = {"verifiers_metrics": metrics, "verifiers_stop": str(state.get("stop_condition") or "")}
        return Transition(messages=messages, reward=reward, terminated=True, info=info)

    def _to_srt(self, message: Any) -> Message:
        """A verifiers message (pydantic or dict) as srt-agent's."""
        get = message.get if hasattr(message, "get") else (lambda k, d=None: getattr(message, k, d))
        role, content = get("role"), get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        text = "" if content is None else str(content)
        if role == "tool":
            call_id = str(get("tool_call_id") or "")
            return tool_result(text, call_id=call_id, name=self._call_names.get(call_id, "tool"))
        if role in ("system", "user", "assistant"):
            return Message(role=role, content=text)
        raise ForeignEnvError(
            f"verifiers environment {self.config.environment!r} sent a message with role {role!r}"
        )

    def close(self) -> None:
        """Stop this env's event loop."""
        self._loop.close()
        super().close()


def register(name: str) -> str:
    """Register ``verifiers:<name>``; its Gymnasium id (``verifiers/<name>``).

    Raises:
        UnknownEnvError: verifiers is not installed, or no module ``name`` can be imported.
    """
    _vf()
    module = name.replace("-", "_").split("/")[-1]
    import importlib.util

    search_current_dir()
    if importlib.util.find_spec(module) is None:
        raise UnknownEnvError(
            f"no verifiers environment module {module!r} is installed (install its package, e.g. with "
            "`prime env install`, or put a module with load_environment() in the current directory)"
        )
    env_id = f"{NAMESPACE}/{name}"
    register_env(env_id, VerifiersEnv, environment=name)
    return env_id

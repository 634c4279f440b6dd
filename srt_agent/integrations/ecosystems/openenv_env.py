"""OpenEnv environments as srt-agent envs: ``openenv:<module>:<name>``.

Install with ``pip install 'srt-agent[openenv]'`` (``openenv-core``). ``<module>:<name>`` names
what an OpenEnv environment package provides (the module is imported from the installed packages
or the current directory):

* an ``Environment`` subclass (``my_envs:GuessEnvironment``): it runs **in process**, one instance
  per srt-agent env, called directly (``reset(seed=...)``, ``step(action)``), no server;
* a server app made by OpenEnv's ``create_app`` (``my_envs:app``): srt-agent **starts the server**
  itself (``python -m uvicorn <module>:<name>`` on a free local port, once per process, stopped
  when the process ends), waits for ``/health``, and plays each episode over its own WebSocket
  session with OpenEnv's ``GenericEnvClient``; a server that exits or does not answer in
  ``start_timeout_s`` is an error quoting its log. ``base_url`` plays against a server already
  running instead. A server admits ``max_concurrent_envs`` sessions: episodes beyond that wait
  (reconnecting with backoff, up to ``start_timeout_s``) for a session to free.

Turns: the assistant's text goes into the action's text field (``action_field``; found from the
action's schema when it has exactly one string field); the observation's text field
(``observation_field``; likewise) is the next user message, or the observation's fields as JSON
when there is no single one. Each step's ``reward`` (``None`` counts 0) is the turn's reward; ``done``
ends the episode. ``reset(seed=s)`` passes the seed; the task id is ``openenv/<module>:<name>/<s>``.
An environment that raises, or a server error, fails the episode with the reason.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import sys
import tempfile
import threading
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tenacity
from pydantic import Field

from srt_agent.chat.messages import Message, user
from srt_agent.env.multi_turn import Transition
from srt_agent.env.registration import UnknownEnvError, register_env, search_current_dir
from srt_agent.errors import FAULTS, describe_fault
from srt_agent.integrations.ecosystems.foreign import (
    ForeignEnv,
    ForeignEnvConfig,
    ForeignEnvError,
    foreign_reward,
    import_package,
    reraise_foreign,
)
from srt_agent.serving.child_server import ServerProcess, ServerStartError, free_port

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "register"]

NAMESPACE = "openenv"

log = logging.getLogger(__name__)

_RESERVED = frozenset({"done", "reward", "metadata"})


class OpenEnvConfig(ForeignEnvConfig):
    """Options of an OpenEnv environment (``gymnasium.make("openenv:<module>:<name>", **options)``)."""

    target: str = Field(description="<module>:<name>: an Environment subclass, or an app from create_app.")
    base_url: str | None = Field(
        None, description="Play against this running server instead of starting one."
    )
    action_field: str | None = Field(None, description="The action's field that gets the assistant's text.")
    observation_field: str | None = Field(None, description="The observation's field shown to the model.")
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the Environment class."
    )
    start_timeout_s: float = Field(
        120.0, gt=0, description="How long a server srt-agent starts may take to answer."
    )
    max_turns: int = Field(100, ge=1, le=10_000, description="Assistant turns before truncation.")


def _openenv() -> Any:
    return import_package("openenv.core", "openenv-core", "openenv")


def _resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    search_current_dir()
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # noqa: BLE001 - the module's own import may fail any way
        raise UnknownEnvError(f"cannot load OpenEnv target {target!r}: {describe_fault(exc)}") from None


def _import_root(module_name: str) -> str:
    """The ``sys.path`` entry ``module_name`` was imported from ("" if unknown)."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return ""
    root = Path(file).resolve().parent
    for _ in range(module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)):
        root = root.parent
    return str(root)


_SERVERS: dict[str, ServerProcess] = {}
_SERVERS_LOCK = threading.Lock()


def _server(target: str, timeout_s: float) -> ServerProcess:
    """The server of ``target`` in this process, started if it is not running."""
    with _SERVERS_LOCK:
        server = _SERVERS.get(target)
        if server is None or not server.alive():
            port = free_port()
            command = [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(port)]
            # The server imports the app where this process found it (an installed package, the
            # current directory, a folder on sys.path).
            paths = [_import_root(target.partition(":")[0]), os.getcwd(), os.environ.get("PYTHONPATH", "")]
            log = Path(tempfile.mkdtemp(prefix="srt-openenv-")) / "server.log"
            server = ServerProcess(
                command,
                f"http://127.0.0.1:{port}",
                log,
                {"PYTHONPATH": os.pathsep.join(p for p in paths if p)},
                name=f"the OpenEnv server for {target!r}",
            )
            try:
                server.start(timeout_s)
            except ServerStartError as exc:
                raise ForeignEnvError(str(exc)) from None
            _SERVERS[target] = server
        return server


@atexit.register
def _stop_servers() -> None:
    for server in list(_SERVERS.values()):
        server.stop()


def _action_class(env_cls: type) -> Any:
    """The Action model of an ``Environment[ActT, ObsT, StateT]`` subclass (its first type argument)."""
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    raise ForeignEnvError(
        f"cannot tell the Action class of {env_cls.__name__}: subclass "
        "Environment[MyAction, MyObservation, MyState]"
    )


def _text_field(schema: dict[str, Any], chosen: str | None, what: str, target: str) -> str | None:
    """The one string field of a JSON schema (or ``chosen``); ``None`` when there is not exactly one."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in _RESERVED}
    if chosen is not None:
        if chosen not in props:
            raise ForeignEnvError(
                f"OpenEnv {target!r}: its {what} has no field {chosen!r} (fields: {sorted(props)})"
            )
        return chosen
    strings = [k for k, v in props.items() if v.get("type") == "string"]
    return strings[0] if len(strings) == 1 else None


def server_busy(exc: BaseException) -> bool:
    """Whether an OpenEnv server refused a session for want of room (so a retry may be admitted).

    Recognised by the pinned client's own types where it has them: the server closes the socket
    (websockets' ``ConnectionClosed``), or answers an error whose code is
    ``WSErrorCode.CAPACITY_REACHED``; openenv-core's client raises that answer as a plain
    ``RuntimeError("Server error: <message> (code: <code>)")``, so the code is matched in that text.
    ``exc`` may be the adapter's :class:`ForeignEnvError`, whose cause is the client's error.
    """
    from openenv.core.env_server.types import WSErrorCode
    from websockets.exceptions import ConnectionClosed

    cause = exc.__cause__ if isinstance(exc, ForeignEnvError) and exc.__cause__ is not None else exc
    if isinstance(cause, ConnectionClosed):
        return True
    return isinstance(cause, RuntimeError) and f"(code: {WSErrorCode.CAPACITY_REACHED.value})" in str(cause)


class OpenEnvEnv(ForeignEnv):
    """An OpenEnv environment, in process or behind a server srt-agent starts: its observations as user turns.

    Args:
        render_mode: ``None`` or ``"ansi"``.
        **options: :class:`OpenEnvConfig` options.
    """

    config_model = OpenEnvConfig

    def __init__(self, render_mode: str | None = None, **options: Any):
        super().__init__(render_mode=render_mode, **options)
        self.config: OpenEnvConfig
        cfg = self.config
        core = _openenv()
        from openenv.core.env_server.interfaces import Environment

        self._local: Any = None
        self._client: Any = None
        self._url: str = ""
        self._core: Any = None
        if cfg.base_url is None:
            found = _resolve(cfg.target)
            if isinstance(found, type) and issubclass(found, Environment):
                self._action_cls = _action_class(found)
                try:
                    self._local = found(**cfg.env_kwargs)
                except Exception as exc:
                    raise reraise_foreign(exc, f"OpenEnv environment {cfg.target!r} (constructor)") from exc
                action_schema = self._action_cls.model_json_schema()
                obs_schema: dict[str, Any] = {}
            elif hasattr(found, "routes"):  # an ASGI app from create_app
                url = _server(cfg.target, cfg.start_timeout_s).url
                action_schema, obs_schema = self._connect(core, url)
            else:
                raise UnknownEnvError(
                    f"OpenEnv target {cfg.target!r} is a {type(found).__name__}: name an Environment "
                    "subclass or an app made by create_app"
                )
        else:
            action_schema, obs_schema = self._connect(core, cfg.base_url)
        field = _text_field(action_schema, cfg.action_field, "action", cfg.target)
        if field is None:
            raise ForeignEnvError(
                f"OpenEnv {cfg.target!r}: its action has no single text field; name one with action_field"
            )
        self._action_field = field
        self._obs_field = _text_field(obs_schema, cfg.observation_field, "observation", cfg.target)

    def _connect(self, core: Any, url: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A WebSocket session of this env on the server; the action and observation schemas."""
        import httpx

        try:
            schema = httpx.get(f"{url}/schema", timeout=10.0).json()
        except Exception as exc:
            raise reraise_foreign(exc, f"OpenEnv server at {url}") from exc
        self._url, self._core = url, core
        self._open_session()
        return dict(schema.get("action") or {}), dict(schema.get("observation") or {})

    def _open_session(self) -> None:
        """A fresh WebSocket session (the previous one, if any, closed)."""
        self._close_session()
        try:
            client = self._core.GenericEnvClient(base_url=self._url).sync()
            client.__enter__()
        except Exception as exc:
            raise reraise_foreign(exc, f"OpenEnv server at {self._url}") from exc
        self._client = client

    def _close_session(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.__exit__(None, None, None)
            except FAULTS as exc:  # the server may have closed it already
                log.debug("closing an OpenEnv session: %s", describe_fault(exc))

    def _reset_when_admitted(self, seed: int) -> str:
        """``reset`` on the server, waiting (up to ``start_timeout_s``) while it is at capacity.

        A server admits ``max_concurrent_envs`` sessions; a rollout may run more episodes at once.
        The server refuses the others (``CAPACITY_REACHED``, or a closed socket): they reconnect
        with backoff until a session frees, instead of failing.
        """
        waiting = tenacity.Retrying(
            stop=tenacity.stop_after_delay(self.config.start_timeout_s),
            wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
            retry=tenacity.retry_if_exception(server_busy),
            before_sleep=lambda _: self._open_session(),  # the refused session is closed: a new one
            reraise=True,
        )
        result: str = waiting(lambda: self._call("reset", seed=seed)[0])
        return result

    def new_task(self, options: dict[str, Any]) -> tuple[str, Sequence[Message]]:
        """``reset(seed=...)`` on the OpenEnv side."""
        if options:
            raise ValueError(f"OpenEnv envs take no reset options, got {sorted(options)}")
        seed = self.task_seed()
        obs = (
            self._call("reset", seed=seed)[0] if self._local is not None else self._reset_when_admitted(seed)
        )
        return f"{NAMESPACE}/{self.config.target}/{seed}", [user(obs)]

    def on_message(self, text: str) -> Transition:
        """The assistant's text as the action; the observation, reward and end that come back."""
        obs, reward, done = self._call("step", text=text)
        return Transition(messages=[user(obs)] if obs else [], reward=reward, terminated=done)

    def _call(self, what: str, *, seed: int | None = None, text: str = "") -> tuple[str, float, bool]:
        target = self.config.target
        try:
            if self._local is not None:
                if what == "reset":
                    result = self._local.reset(seed=seed)
                else:
                    result = self._local.step(self._action_cls(**{self._action_field: text}))
                data = result.model_dump()
                reward, done = data.get("reward"), data.get("done", False)
            else:
                step = (
                    self._client.reset(seed=seed)
                    if what == "reset"
                    else self._client.step({self._action_field: text})
                )
                data, reward, done = dict(step.observation or {}), step.reward, step.done
        except ForeignEnvError:
            raise
        except Exception as exc:
            raise reraise_foreign(exc, f"OpenEnv environment {target!r} {what}") from exc
        value = 0.0  # OpenEnv's observations may carry no reward: nothing was scored this step
        if reward is not None:
            value = foreign_reward(reward, f"OpenEnv environment {target!r}: {what}'s reward")
        return self._observation_text(data), value, bool(done)

    def _observation_text(self, data: dict[str, Any]) -> str:
        fields = {k: v for k, v in data.items() if k not in _RESERVED}
        if self._obs_field is not None and isinstance(fields.get(self._obs_field), str):
            return str(fields[self._obs_field])
        strings = [v for v in fields.values() if isinstance(v, str)]
        if len(strings) == 1:
            return strings[0]
        return json.dumps(fields, default=str)

    def close(self) -> None:
        """Close the WebSocket session or the in-process environment (a started server runs on, shared)."""
        self._close_session()
        try:
            if self._local is not None:
                self._local.close()
        except FAULTS as exc:  # closing is best effort: the episode's result is already recorded
            log.debug("closing OpenEnv %s: %s", self.config.target, describe_fault(exc))
        self._local = None
        super().close()


def register(name: str) -> str:
    """Register ``openenv:<module>:<name>``; its Gymnasium id (``openenv/<module>.<name>``).

    Raises:
        UnknownEnvError: openenv-core is not installed, or ``name`` is not ``<module>:<attribute>``.
    """
    _openenv()
    module, sep, attr = name.partition(":")
    if not sep:
        module, _, attr = name.rpartition(".")  # the resolved id's form, in another process
    if not module or not attr:
        raise UnknownEnvError(
            f"name an OpenEnv environment as openenv:<module>:<Environment class or app>, got {name!r}"
        )
    env_id = f"{NAMESPACE}/{module}.{attr}"
    register_env(env_id, OpenEnvEnv, target=f"{module}:{attr}")
    return env_id

"""Registering multi-turn envs with gymnasium, and making them with helpful errors.

Built-in envs register on ``import srt_agent.envs`` as ``srt/<Name>-v<k>``. Custom envs register the
same way (:func:`register_env`) and then show up in ``srt-agent envs`` and work with every command.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from srt_agent.env.multi_turn import MultiTurnEnv, validate_config
from srt_agent.errors import FAULTS, SrtAgentError

Isolation = Literal["thread", "process"]
"""Where an env's code runs: in the rollout's process (a thread per call) or in a worker process."""

_REGISTERED: dict[str, str] = {}
_ISOLATION: dict[str, Isolation] = {}


class UnknownEnvError(SrtAgentError, gym.error.Error, KeyError):
    """No env is registered under the requested id."""

    def __str__(self) -> str:
        return str(self.args[0])


_MAKE_ARGUMENTS = frozenset({"max_episode_steps", "disable_env_checker"})
"""Keywords of ``make`` that are Gymnasium's, not the env's."""


def register_env(
    env_id: str,
    entry_point: str | type[MultiTurnEnv],
    *,
    isolation: Isolation | None = None,
    **default_options: Any,
) -> None:
    """Register a multi-turn env with gymnasium (idempotent for the same entry point).

    Args:
        env_id: ``namespace/Name-vN``, e.g. ``"myproj/Support-v0"``.
        entry_point: ``"module:Class"`` or the class itself.
        isolation: Where rollouts run this env's code when ``rollout.env_isolation`` is unset:
            ``"process"`` for code that may crash the process or hang in native code (a C
            extension, ctypes, a simulator), ``"thread"`` or ``None`` (the default) in-process.
            The class must then be importable from a module (not a script's ``__main__``).
        **default_options: Default constructor options (overridable in ``gymnasium.make``).
    """
    if isolation not in (None, "thread", "process"):
        raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
    if isinstance(entry_point, str):
        ep = entry_point
    else:
        ep = f"{entry_point.__module__}:{entry_point.__qualname__}"
    if env_id in gym.registry:
        if _REGISTERED.get(env_id) == ep:
            return
        if env_id in _REGISTERED:
            raise ValueError(f"{env_id!r} is already registered to {_REGISTERED[env_id]}, not {ep}")
    gym.register(id=env_id, entry_point=ep, kwargs=default_options)
    _REGISTERED[env_id] = ep
    if isolation is not None:
        _ISOLATION[env_id] = isolation


def registered_isolation(env_id: str) -> Isolation:
    """Where ``env_id``'s code runs by its registration (``"thread"`` unless it registered ``"process"``).

    Raises:
        UnknownEnvError: ``env_id`` is not registered.
    """
    return _ISOLATION.get(check_env_id(env_id), "thread")


def resolve_isolation(env_id: str, configured: Isolation | None, known: dict[str, Isolation]) -> Isolation:
    """Where a rollout runs ``env_id``'s code: ``configured`` if set, else its registration.

    ``configured`` is ``rollout.env_isolation``; the registration is looked up once per id into
    ``known``. An unknown id runs in a thread: its episodes then fail in ``make``, with the reason.
    """
    if configured is not None:
        return configured
    if env_id not in known:
        try:
            known[env_id] = registered_isolation(env_id)
        except FAULTS:
            known[env_id] = "thread"
    return known[env_id]


def registered_envs() -> list[str]:
    """Ids of every multi-turn env registered so far (built-ins are registered on first call)."""
    import srt_agent.envs  # noqa: F401 - registers the built-in envs

    return sorted(_REGISTERED)


def make(env_id: str, **options: Any) -> gym.Env[tuple[Any, ...], str]:
    """``gymnasium.make`` with built-ins registered and an error listing the valid ids.

    Args:
        env_id: A registered id, e.g. ``"srt/Retail-v0"``.
        **options: Env options (see ``srt-agent envs``) and gymnasium's own ``make`` arguments.

    Raises:
        UnknownEnvError: ``env_id`` is not registered; the message lists the registered ids.
        EnvConfigError: An option is unknown or invalid; the message lists valid ones.
    """
    return gym.make(check_env_id(env_id), **options)


def check_env_id(env_id: str) -> str:
    """The registered id ``env_id`` names; :class:`UnknownEnvError` (listing the ids) if none.

    ``"module:Namespace/Name-v0"`` (Gymnasium's syntax) first imports ``module``, which registers
    the env (the current directory is searched too, so a user's ``my_envs.py`` works from the CLI),
    and returns ``"Namespace/Name-v0"``. An ecosystem's prefix instead (``textarena:Wordle-v0``,
    ``reasoning_gym:chain_sum``; see :mod:`srt_agent.integrations.ecosystems`) registers that
    ecosystem's env and returns its id in the ecosystem's namespace.
    """
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        foreign = _foreign_env(module, name)
        if foreign is None:
            import_env_module(module)
        env_id = foreign or name
    elif env_id not in gym.registry and "/" in env_id:
        # An id a prefix resolved to (``textarena/GuessTheNumber-v0``), in a process that has not
        # registered it yet (a Ray env worker, an OpenRLHF engine).
        namespace, _, name = env_id.partition("/")
        env_id = _foreign_env(namespace, name) or env_id
    known = registered_envs()
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"unknown env id {env_id!r}.{hint} Registered multi-turn envs: {', '.join(known)}. "
            "An env of your own: name its module as MODULE:ID (e.g. my_envs:mine/Weather-v0)"
        )
    return env_id


def has_oracle(env_id: str) -> bool:
    """Whether the registered env is a :class:`MultiTurnEnv` with an oracle of its own.

    Raises:
        UnknownEnvError: ``env_id`` is not registered.
    """
    env_cls = _env_class(check_env_id(env_id))
    return (
        isinstance(env_cls, type)
        and issubclass(env_cls, MultiTurnEnv)
        and env_cls.oracle is not MultiTurnEnv.oracle
    )


def require_oracle(env_id: str, option: str) -> None:
    """Refuse ``option`` (a setting that needs the env's oracle) on an env that has none.

    Raises:
        ValueError: The env has no oracle; the message names ``option`` and the env.
        UnknownEnvError: ``env_id`` is not registered.
    """
    if not has_oracle(env_id):
        raise ValueError(f"{option}: {env_id} has no oracle to play the start of its tasks")


def _env_class(env_id: str) -> Any:
    """The registered entry point of ``env_id``: a class, or a factory function."""
    entry = gym.spec(env_id).entry_point
    return load_env_creator(entry) if isinstance(entry, str) else entry


def validate_env_options(env_id: str, options: Mapping[str, Any] | None = None) -> str:
    """:func:`check_env_id`, and ``options`` checked against the env's config model, building nothing.

    A command checks its env this way before it loads a model, so a typo costs milliseconds; the
    episodes then ``make`` their envs with the same options. Envs that are not :class:`MultiTurnEnv`
    subclasses (a plain Gymnasium env, a factory function) have their options checked when made.

    Returns:
        The registered id (without a ``module:`` prefix).

    Raises:
        UnknownEnvError: ``env_id`` is not registered.
        EnvConfigError: An option is unknown or invalid; the message lists valid ones.
    """
    env_id = check_env_id(env_id)
    registered = gym.spec(env_id)
    env_cls = _env_class(env_id)
    if isinstance(env_cls, type) and issubclass(env_cls, MultiTurnEnv):
        # Constructor parameters of its own (``render_mode``, a callback, ...) are not options.
        own = set(inspect.signature(env_cls).parameters) | _MAKE_ARGUMENTS
        given = {**registered.kwargs, **(options or {})}
        validate_config(env_cls, {k: v for k, v in given.items() if k not in own})
    return env_id


ENV_PREFIX_GROUP = "srt_agent.env_prefixes"
"""Entry-point group of env-id prefixes (``textarena:``, ``reasoning_gym:``, ...).

Each entry is ``prefix = "module:callable"``: the callable takes the name after the prefix,
registers that env with Gymnasium and returns its id. srt-agent declares its ecosystems' adapters
(:mod:`srt_agent.integrations.ecosystems`) in its ``pyproject.toml``; another installed package can
declare prefixes of its own the same way. Declared, not imported by name: this layer never reaches
up into the adapters, which sit above it."""


@functools.cache
def env_prefixes() -> dict[str, EntryPoint]:
    """Every declared env-id prefix and the entry point that resolves it."""
    return {ep.name: ep for ep in entry_points(group=ENV_PREFIX_GROUP)}


def _foreign_env(prefix: str, name: str) -> str | None:
    """The Gymnasium id of the env ``prefix:name`` of a declared prefix (registered now), or ``None``."""
    entry = env_prefixes().get(prefix)
    if entry is None:
        return None
    env_id: str = entry.load()(name)
    return env_id


def search_current_dir() -> None:
    """Put the current directory on ``sys.path`` (as ``python -m`` would), once.

    So a module next to the user's files is found from the command line: an env module here,
    an ecosystem's environment module (verifiers, OpenEnv) in the adapters.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)


def import_env_module(module: str) -> None:
    """Import the module that registers an env (``module`` of ``"module:Id"``), with a clear error.

    Raises:
        UnknownEnvError: The module cannot be imported (the message says why).
    """
    search_current_dir()
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise UnknownEnvError(f"cannot import env module {module!r}: {exc}") from None

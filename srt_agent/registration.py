"""Registering multi-turn envs with gymnasium, and making them with helpful errors.

Built-in envs register on ``import srt_agent.envs`` as ``srt/<Name>-v<k>``. Custom envs register the
same way (:func:`register_env`) and then show up in ``srt-agent envs`` and work with every command.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym

from srt_agent.env import MultiTurnEnv

_REGISTERED: dict[str, str] = {}


class UnknownEnvError(gym.error.Error, KeyError):
    """No env is registered under the requested id."""

    def __str__(self) -> str:
        return str(self.args[0])


def register_env(env_id: str, entry_point: str | type[MultiTurnEnv], **default_options: Any) -> None:
    """Register a multi-turn env with gymnasium (idempotent for the same entry point).

    Args:
        env_id: ``namespace/Name-vN``, e.g. ``"myproj/Support-v0"``.
        entry_point: ``"module:Class"`` or the class itself.
        **default_options: Default constructor options (overridable in ``gymnasium.make``).
    """
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
        srt_agent.env.EnvConfigError: An option is unknown or invalid; the message lists valid ones.
    """
    check_env_id(env_id)
    return gym.make(env_id, **options)


def check_env_id(env_id: str) -> None:
    """Raise :class:`UnknownEnvError` (listing the registered ids) unless ``env_id`` is registered."""
    known = registered_envs()
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"unknown env id {env_id!r}.{hint} Registered multi-turn envs: {', '.join(known)}"
        )

"""Environments from other ecosystems, played as srt-agent multi-turn envs without glue.

Name one with its ecosystem's prefix wherever an env id goes (``play``, ``eval``, ``train``,
``bench rollout``, the OpenRLHF executor, Ray env workers):

* ``textarena:<GameId>`` (``textarena``): a single-player TextArena game, e.g.
  ``textarena:GuessTheNumber-v0``;
* ``reasoning_gym:<dataset>`` (``reasoning-gym``): a procedural dataset scored by its own
  ``score_answer``, e.g. ``reasoning_gym:basic_arithmetic``;
* ``verifiers:<environment module>`` (``verifiers``): an environment's ``load_environment``;
* ``openenv:<module:Environment>`` (``openenv-core``): an OpenEnv environment, served over HTTP.

The prefix resolves to a Gymnasium id in the ecosystem's namespace (``textarena/GuessTheNumber-v0``),
registered on first use in each process, so the id works in worker processes too. Each adapter
lives in its own module and imports its package only when an env is made; the packages are
optional extras (``pip install 'srt-agent[textarena]'`` and so on).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import partial

__all__ = ["ECOSYSTEMS", "Ecosystem", "ecosystem", "register_foreign_env"]


@dataclass(frozen=True)
class Ecosystem:
    """One ecosystem: env-id prefix, package (PyPI and import names, extra), adapter, example id."""

    prefix: str
    package: str
    import_name: str
    extra: str
    adapter: str
    example: str

    def installed_version(self) -> str | None:
        """The installed package's version, or ``None`` if it is not installed."""
        from importlib import metadata

        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return None


_HERE = __name__
ECOSYSTEMS: dict[str, Ecosystem] = {
    e.prefix: e
    for e in (
        Ecosystem("textarena", "textarena", "textarena", "textarena", f"{_HERE}.textarena_env",
                  "textarena:GuessTheNumber-v0"),
        Ecosystem("reasoning_gym", "reasoning-gym", "reasoning_gym", "reasoning-gym",
                  f"{_HERE}.reasoning_gym_env", "reasoning_gym:basic_arithmetic"),
        Ecosystem("verifiers", "verifiers", "verifiers", "verifiers", f"{_HERE}.verifiers_env",
                  "verifiers:my_environment"),
        Ecosystem("openenv", "openenv-core", "openenv", "openenv", f"{_HERE}.openenv_env",
                  "openenv:my_envs.EchoEnvironment"),
    )
}  # fmt: skip
"""Every ecosystem by prefix (``reasoning-gym:`` is accepted for ``reasoning_gym:`` too)."""

_ALIASES = {"reasoning-gym": "reasoning_gym", "openenv-core": "openenv"}


def ecosystem(prefix: str) -> Ecosystem | None:
    """The ecosystem an env-id prefix (or a Gymnasium namespace) names, or ``None``."""
    return ECOSYSTEMS.get(_ALIASES.get(prefix, prefix))


def register_foreign_env(prefix: str, name: str) -> str:
    """Register the env ``prefix:name`` with Gymnasium (once per process); its Gymnasium id.

    Raises:
        KeyError: ``prefix`` is not an ecosystem.
        UnknownEnvError: The ecosystem's package is missing, or has no such environment (the
            message says which and how to list them).
    """
    found = ecosystem(prefix)
    if found is None:
        raise KeyError(prefix)
    module = importlib.import_module(found.adapter)
    env_id: str = module.register(name)
    return env_id


# The resolvers pyproject.toml declares in the ``srt_agent.env_prefixes`` entry-point group, one
# per prefix (aliases included): how ``make("textarena:Wordle-v0")`` reaches these adapters.
resolve_textarena = partial(register_foreign_env, "textarena")
resolve_reasoning_gym = partial(register_foreign_env, "reasoning_gym")
resolve_verifiers = partial(register_foreign_env, "verifiers")
resolve_openenv = partial(register_foreign_env, "openenv")

"""One error family: every exception class the package defines derives from ``SrtAgentError``."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from srt_agent.errors import SrtAgentError

# Control flow inside one module, never raised to a caller: not part of the family.
INTERNAL = {"srt_agent.env.play.QuitPlay", "srt_agent.envs.calculator_problems.Reject"}
OPTIONAL = ("sglang", "openrlhf", "vllm", "ray")  # modules that need an optional package


def _exception_classes() -> dict[str, type[BaseException]]:
    import srt_agent.envs
    import srt_agent.tools

    found: dict[str, type[BaseException]] = {}
    trees = [(srt_agent.__path__, "srt_agent."), (srt_agent.envs.__path__, "srt_agent.envs.")]
    trees.append((srt_agent.tools.__path__, "srt_agent.tools."))  # installed from envs/ and tools/
    infos = [info for path, prefix in trees for info in pkgutil.walk_packages(path, prefix)]
    for info in infos:
        try:
            module = importlib.import_module(info.name)
        except ImportError as exc:
            if any(name in str(exc) for name in OPTIONAL):
                continue
            raise
        for name, obj in vars(module).items():
            public = not name.startswith("_")  # private ones are one module's own control flow
            if (
                public
                and isinstance(obj, type)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
            ):
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_exception_of_the_package_derives_from_the_base() -> None:
    classes = _exception_classes()
    assert len(classes) >= 20, sorted(classes)  # the walk found the package's exceptions
    outside = sorted(n for n, c in classes.items() if n not in INTERNAL and not issubclass(c, SrtAgentError))
    assert not outside, f"derive these from srt_agent.errors.SrtAgentError: {outside}"


def test_the_family_keeps_the_builtin_kinds() -> None:
    from srt_agent.config import ConfigError
    from srt_agent.engine.hf_checkpoint import CheckpointError
    from srt_agent.env.registration import UnknownEnvError
    from srt_agent.recipe.build import BuildDirError

    assert issubclass(ConfigError, ValueError) and issubclass(BuildDirError, FileExistsError)
    assert issubclass(UnknownEnvError, KeyError)
    with pytest.raises(SrtAgentError, match="bad"):
        raise CheckpointError("bad")

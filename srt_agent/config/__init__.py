"""Run configuration: one pydantic model per component, composed into :class:`RunConfig`.

Load with :func:`load_config` from YAML files in ``configs/`` plus dotted command-line overrides
(``trainer.steps=30 spec.enabled=false algo.clip_high=0.28``)::

    cfg = load_config("configs/quickstart.yaml", ["trainer.steps=30"])
    cfg.algo.estimator, cfg.flat()["optim.lr"]

Importing this package does not import torch or transformers.
"""

from srt_agent.config.algo import (
    AlgoSection,
    DynamicSamplingSection,
    KLSection,
    OverlongSection,
)
from srt_agent.config.loader import (
    ConfigError,
    apply_overrides,
    describe_errors,
    load_config,
    merge,
    parse_override,
    read_yaml,
)
from srt_agent.config.run import RunConfig
from srt_agent.config.sections import (
    EnvSection,
    EvalSeeds,
    ModelSection,
    RolloutSection,
    SeedRange,
    SpecSection,
    TrainSeeds,
)
from srt_agent.config.training import OptimSection, TrainerSection

__all__ = [
    "AlgoSection",
    "ConfigError",
    "DynamicSamplingSection",
    "EnvSection",
    "EvalSeeds",
    "KLSection",
    "ModelSection",
    "OptimSection",
    "OverlongSection",
    "RolloutSection",
    "RunConfig",
    "SeedRange",
    "SpecSection",
    "TrainSeeds",
    "TrainerSection",
    "apply_overrides",
    "describe_errors",
    "load_config",
    "merge",
    "parse_override",
    "read_yaml",
]

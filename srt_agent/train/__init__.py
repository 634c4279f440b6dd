"""Training: the in-process RL trainer behind ``srt-agent train``.

:class:`Trainer` runs the loop (SRT rollouts, advantages, policy updates, weight sync to the engine,
atomic checkpoints, held-out evaluations); :func:`train_command` is what the CLI runs (build the
model if missing, progress bars, summary table, plots, ``--json``).
"""

from srt_agent.train.checkpoint import Checkpoint, latest_checkpoint, list_checkpoints
from srt_agent.train.command import SUMMARY_SCHEMA, train_command
from srt_agent.train.summary import summarize
from srt_agent.train.trainer import Trainer, TrainError

__all__ = [
    "SUMMARY_SCHEMA",
    "Checkpoint",
    "TrainError",
    "Trainer",
    "latest_checkpoint",
    "list_checkpoints",
    "summarize",
    "train_command",
]

"""Rollouts on a Ray cluster: engine replicas and env workers as actors, the learner in the driver.

``RayConfig`` imports without Ray; ``RayEngine`` and ``EnvWorkerPool`` need it (the ``ray`` extra).
"""

from srt_agent.distributed.ray_config import RayConfig

__all__ = ["RayConfig"]

"""What ``srt-agent bench`` runs: measurements side by side in one process, each with ``--json``.

* :mod:`~srt_agent.speed.engine_speed`: TorchEngine's decode speed against HF ``generate()``;
* :mod:`~srt_agent.speed.rollout_speed` and :mod:`~srt_agent.speed.rollout_report`: multi-round rollouts
  with SRT off and on, random drafts, the cache alone, HF peers and slow tools;
* :mod:`~srt_agent.speed.peers`: the peers those are compared with (HF engines, random drafts);
* :mod:`~srt_agent.speed.random_model`: random checkpoints of a given shape, to time engines at
  sizes no trained model here has.

Scripts that diagnose rather than compare live in ``benchmarks/`` at the top of the repository.
"""

"""The soaks' fault injector: :mod:`srt_agent.env.chaos`, registered as ``soak/<Name>-v0``.

``soak/<Name>-v0`` wraps ``srt/<Name>-v0``; its ``fault`` option says what goes wrong in that
episode (``""``: nothing). A hang sleeps ``HANG_S``, longer than the soak's deadlines, so the call is
abandoned and its thread ends by itself soon after. The ids stay importable by the MODULE:ID syntax
(``fault_injection:soak/Calculator-v0``) for Ray env workers.
"""

from __future__ import annotations

import gymnasium as gym

from srt_agent.env.chaos import CHAOS_BASES, ENV_FAULTS, HANG_S, PROCESS_FAULTS, TOOL_FAULTS, make_faulty

__all__ = ["BASES", "ENV_FAULTS", "HANG_S", "PROCESS_FAULTS", "TOOL_FAULTS", "make_faulty"]

BASES = CHAOS_BASES
for _name in BASES:
    if f"soak/{_name}-v0" not in gym.registry:
        gym.register(
            id=f"soak/{_name}-v0",
            entry_point=make_faulty,  # type: ignore[arg-type]
            kwargs={"base": f"srt/{_name}-v0"},
            disable_env_checker=True,
        )

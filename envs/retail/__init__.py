"""``srt/Retail-v0``: τ-bench-retail-style customer service with a simulated customer.

Modules: :mod:`.db` (records and generation), :mod:`.actions` (write operations and rules),
:mod:`.tasks` (hidden goals and the info check), :mod:`.tools` (the agent's tools and session rules),
:mod:`.phrases` and :mod:`.user_sim` (the customer), :mod:`.env` (the env), :mod:`.oracle`.
"""

from srt_agent.envs.retail.env import RetailConfig, RetailEnv

__all__ = ["RetailConfig", "RetailEnv"]

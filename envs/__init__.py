"""Built-in multi-turn environments, registered with gymnasium on import.

Installed as ``srt_agent.envs`` (the folder is ``envs/`` at the repository top level).
"""

from srt_agent.env.registration import register_env

register_env("srt/Calculator-v0", "srt_agent.envs.calculator:CalculatorEnv")
register_env("srt/Retail-v0", "srt_agent.envs.retail.env:RetailEnv")
register_env("srt/GuessNumber-v0", "srt_agent.envs.guess_number:GuessNumberEnv")
register_env("srt/RetailCopy-v0", "srt_agent.envs.retail.copy_drill:RetailCopyEnv")
register_env("srt/RetailLookup-v0", "srt_agent.envs.retail.lookup_drill:RetailLookupEnv")

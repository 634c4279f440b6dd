"""Shared pytest setup: register the built-in envs once for every test."""

import srt_agent.envs  # noqa: F401 - registers srt/* envs with gymnasium

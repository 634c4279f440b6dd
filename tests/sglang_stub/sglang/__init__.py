"""A stand-in for the parts of sglang==0.5.23 the SRT plugin touches (tests only)."""

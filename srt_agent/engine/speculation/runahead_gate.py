"""Whether run-ahead pays on this engine: the forward time it costs against the decode time it saves.

Run-ahead (:mod:`srt_agent.rollout.runahead`) generates into the tree cache while live episodes
wait, on rows the live ones leave free. On a GPU a decode step's extra rows are nearly free; on a
CPU each row costs about as much as the last, and a run-ahead row's prefill of a whole first-turn
prompt holds the engine while live requests arrive. Measured on 2 CPU cores (the embedded model's
`bench rollout`): run-ahead added ~3.5 s of forwards to a 34 s run and its drafts saved almost none
(343 run-ahead tokens, SRT 0.89x with it and 0.95x without it).

So the engine keeps a ledger. It charges run-ahead the time it adds: the run-ahead rows' share of
each prefill, and of each decode step what the step took beyond a step of its live rows alone (by
the cost model's plain-step fit). It credits run-ahead the decode time its accepted draft tokens
saved (each saves one row a step: ``1 / batch`` of a step). Run-ahead is admitted while its net
cost stays within :data:`MAX_NET_LOSS` of all forward time, so where it never pays it costs at most
that share (it runs in short bursts as forward time accrues, and any later credit reopens it), and
where it pays it runs without limit.
"""

from __future__ import annotations

MAX_NET_LOSS = 0.01
"""Largest share of the engine's forward time that run-ahead may cost beyond what it saved."""


class RunAheadGate:
    """The run-ahead ledger of one engine (its worker thread only)."""

    def __init__(self) -> None:
        self.cost_s = 0.0  # forward time run-ahead added
        self.saved_s = 0.0  # decode time its accepted drafts saved
        self.forward_s = 0.0  # all forward time (prefill and decode)

    def open(self) -> bool:
        """Whether run-ahead may take rows now."""
        return self.cost_s - self.saved_s <= MAX_NET_LOSS * self.forward_s

    def prefill(self, seconds: float, runahead_tokens: int, tokens: int) -> None:
        """A prefill of ``tokens`` new tokens, ``runahead_tokens`` of them for run-ahead rows."""
        self.forward_s += seconds
        if runahead_tokens and tokens:
            self.cost_s += seconds * runahead_tokens / tokens

    def decode(self, seconds: float, alone_s: float, runahead_rows: int) -> None:
        """A decode step that took ``seconds``; its live rows alone would have taken ``alone_s``."""
        self.forward_s += seconds
        if runahead_rows:
            self.cost_s += max(0.0, seconds - alone_s)

    def credit(self, accepted: int, step_s: float, batch: int) -> None:
        """``accepted`` draft tokens from run-ahead accepted in a step of ``batch`` rows."""
        if accepted and batch:
            self.saved_s += accepted * step_s / batch

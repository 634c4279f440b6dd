"""The engine's run-ahead limits: idle rows by the plain-step fit, and the ledger of what run-ahead pays."""

from __future__ import annotations

from srt_agent.engine.speculation.budget import CostModel
from srt_agent.engine.speculation.runahead_gate import MAX_NET_LOSS, RunAheadGate
from srt_agent.engine.speculation.spec_config import SpecConfig


def _fitted(per_step: float, per_row: float, slowdown: float = 0.05) -> CostModel:
    model = CostModel(SpecConfig(runahead_slowdown=slowdown))
    for rows in (1, 2, 4, 8, 16, 32):
        for _ in range(3):
            model.observe_step(rows, 1, per_step + per_row * rows)
    return model


def test_spare_rows_follow_the_marginal_cost_of_a_row() -> None:
    gpu_like = _fitted(per_step=0.010, per_row=0.00001)  # a row adds 0.1% of a step
    cpu_like = _fitted(per_step=0.0012, per_row=0.0003)  # measured on 2 cores: ~0.3 ms a row
    assert gpu_like.spare_rows(8) >= 48
    assert cpu_like.spare_rows(8) == 0  # 8 live rows: 3.6 ms; one more row is +8%
    assert cpu_like.spare_rows(32) == 1  # 10.8 ms: one row is +2.8%, two +5.6%
    assert cpu_like.spare_rows(0) == 0  # nothing live: sized as for one live row
    assert gpu_like.spare_rows(0) >= 48
    assert _fitted(0.0012, 0.0003, slowdown=10).spare_rows(8) >= 1 << 20  # no limit
    # Many spare rows are not "no limit": the engine's ledger still closes run-ahead that does not pay.
    assert not gpu_like.runahead_unlimited
    assert _fitted(0.0012, 0.0003, slowdown=10).runahead_unlimited


def test_the_gate_closes_when_run_ahead_costs_more_than_it_saves_and_reopens_with_credit() -> None:
    gate = RunAheadGate()
    assert gate.open()
    gate.decode(1.0, 1.0, runahead_rows=0)  # live work only
    gate.prefill(0.05, runahead_tokens=600, tokens=600)  # a run-ahead prefill: 5% of the time so far
    assert not gate.open()
    gate.credit(accepted=16, step_s=0.1, batch=32)  # its drafts saved 0.05 s
    assert gate.open()
    # A decode step charges only what its run-ahead rows added beyond the live rows' step.
    gate.decode(0.0105, 0.010, runahead_rows=4)
    assert abs(gate.cost_s - 0.0505) < 1e-12
    # Where run-ahead never pays, its net cost stays within MAX_NET_LOSS of forward time.
    gate = RunAheadGate()
    for _ in range(1000):
        gate.decode(0.004, 0.004, runahead_rows=0)
        if gate.open():
            gate.decode(0.002, 0.0, runahead_rows=2)  # a step of run-ahead rows alone
    assert gate.cost_s <= MAX_NET_LOSS * gate.forward_s + 0.002
    assert gate.cost_s > 0.5 * MAX_NET_LOSS * gate.forward_s  # it runs in bursts, not never

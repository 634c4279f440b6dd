"""KL estimators, KL as a reward penalty or a loss, and token-aligned logprobs / entropy."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from srt_agent.algo import (
    Aggregation,
    kl_estimate,
    kl_loss,
    kl_penalized_rewards,
    masked_mean,
    token_entropy,
    token_logprobs,
)

LN2 = math.log(2.0)


def test_kl_estimators_by_hand() -> None:
    logp, ref = torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]]))
    # r = log(0.25 / 0.5) = -ln 2
    assert float(kl_estimate(logp, ref, "k1")) == pytest.approx(LN2)  # -r
    assert float(kl_estimate(logp, ref, "k2")) == pytest.approx(0.5 * LN2**2)  # 0.240227
    assert float(kl_estimate(logp, ref, "k3")) == pytest.approx(0.5 - 1 + LN2)  # e^r - 1 - r = 0.193147


def test_k1_and_k3_are_unbiased_on_an_exact_expectation() -> None:
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.25, 0.5])
    true_kl = 0.5 * LN2 + 0.25 * math.log(0.5)  # sum p log(p / q) = 0.173287
    for est in ("k1", "k3"):
        expectation = float((p * kl_estimate(p.log(), q.log(), est)).sum())  # type: ignore[arg-type]
        assert expectation == pytest.approx(true_kl, abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.floats(-20, 5, allow_nan=False), st.floats(-20, 5, allow_nan=False))
def test_k2_and_k3_are_never_negative(logp: float, ref: float) -> None:
    a, b = torch.tensor([logp]), torch.tensor([ref])
    assert float(kl_estimate(a, b, "k3")) >= 0.0
    assert float(kl_estimate(a, b, "k2")) >= 0.0


def test_unknown_estimator_is_named() -> None:
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; choose from k1, k2, k3"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]


def test_kl_penalty_is_subtracted_on_generated_tokens_only() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.25, 0.25]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    out = kl_penalized_rewards(rewards, logp, ref, mask, coef=0.1, estimator="k1")
    torch.testing.assert_close(out, torch.tensor([[0.0, -0.1 * LN2, 1.0 - 0.1 * LN2]]))
    assert not out.requires_grad


def test_kl_loss_aggregates_and_has_a_gradient() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.9]])).requires_grad_(True)
    ref = torch.log(torch.tensor([[0.25, 0.9]]))
    loss = kl_loss(logp, ref, torch.ones(1, 2), "k3", Aggregation("token-mean"))
    assert loss.item() == pytest.approx((0.5 - 1 + LN2 + 0.0) / 2)
    loss.backward()
    assert logp.grad is not None
    # d/dlogp (e^(ref - logp) - 1 - (ref - logp)) = 1 - e^(ref - logp) = 1 - 0.5; token 2 at the minimum
    torch.testing.assert_close(logp.grad, torch.tensor([[0.25, 0.0]]))


# Logits of one sequence of 3 tokens over a 2-token vocabulary.
LOGITS = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [9.0, -9.0]]])
TOKENS = torch.tensor([[1, 1, 0]])


def test_token_logprobs_are_shifted_to_the_token_they_score() -> None:
    # token 1 is scored by logits[0] = uniform: log 1/2; token 2 (id 0) by logits[1]: log 3/4
    torch.testing.assert_close(token_logprobs(LOGITS, TOKENS), torch.tensor([[0.0, -LN2, math.log(0.75)]]))
    # temperature 2: logits[1] / 2 -> p(0) = sqrt(3) / (sqrt(3) + 1)
    hot = token_logprobs(LOGITS, TOKENS, temperature=2.0)
    assert float(hot[0, 2]) == pytest.approx(math.log(math.sqrt(3) / (math.sqrt(3) + 1)), abs=1e-6)


def test_token_entropy_by_hand_and_its_masked_mean() -> None:
    entropy = token_entropy(LOGITS)
    h2 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # 0.562335
    torch.testing.assert_close(entropy, torch.tensor([[0.0, LN2, h2]]))
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    assert float(masked_mean(entropy, mask)) == pytest.approx((LN2 + h2) / 2)


def test_logit_helpers_check_shapes() -> None:
    with pytest.raises(ValueError, match=r"must be \(B, T, V\)"):
        token_entropy(LOGITS[0])
    with pytest.raises(ValueError, match="token_ids"):
        token_logprobs(LOGITS, TOKENS[:, :2])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(LOGITS, TOKENS, temperature=0.0)


def test_as_losses_k2_follows_the_reverse_kl_and_k3_the_forward_kl() -> None:
    theta = torch.tensor([0.3, -0.2, 0.5], requires_grad=True)
    ref = torch.log_softmax(torch.tensor([0.0, 0.4, -0.3]), dim=0)

    def grad(objective: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad(objective, theta)
        return g

    def expected_estimator_grad(est: str) -> torch.Tensor:  # E_{x ~ pi}[d k(x)], samples held fixed
        logp = torch.log_softmax(theta, dim=0)
        return grad((logp.exp().detach() * kl_estimate(logp, ref, est)).sum())  # type: ignore[arg-type]

    logp = torch.log_softmax(theta, dim=0)
    reverse = grad((logp.exp() * (logp - ref)).sum())
    logp = torch.log_softmax(theta, dim=0)
    forward = grad((ref.exp() * (ref - logp)).sum())
    torch.testing.assert_close(expected_estimator_grad("k2"), reverse)
    torch.testing.assert_close(expected_estimator_grad("k3"), forward)

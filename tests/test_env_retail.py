"""srt/Retail-v0: env contract, oracle, domain rules, the simulated customer and the reward."""

import re
from collections import Counter
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest

from srt_agent.chat.messages import Message, assistant
from srt_agent.env.episode_loop import run_episode
from srt_agent.env.multi_turn import EnvConfigError, oracle_policy
from srt_agent.env.testing import check_multiturn_env
from srt_agent.envs.retail import actions
from srt_agent.envs.retail.db import generate_database
from srt_agent.envs.retail.env import RetailEnv
from srt_agent.envs.retail.phrases import STOP
from srt_agent.envs.retail.progress import task_progress
from srt_agent.envs.retail.tasks import InfoItem, goal_database, missing_info, numbers_in, sample_task
from srt_agent.envs.retail.tools import WRITE_TOOLS
from srt_agent.tooling.parser import format_tool_call

History = list[Message]


def drive(env: RetailEnv, seed: int, kind: str, stop: Callable[[str], bool]) -> tuple[History, str]:
    """Play the oracle until its next turn satisfies ``stop``; return the history and that turn."""
    obs, _ = env.reset(seed=seed, options={"task_kind": kind})
    oracle = env.oracle()
    history = list(obs)
    for _ in range(env.config.max_turns):
        action = oracle.act(history)
        if stop(action):
            return history, action
        obs, _, terminated, truncated, _ = env.step(action)
        assert not (terminated or truncated), f"episode ended before the stop condition: {obs}"
        history += [assistant(action), *obs]
    raise AssertionError("stop condition never met")


def step(env: RetailEnv, history: History, action: str) -> tuple[Message, float, bool, dict[str, object]]:
    obs, reward, terminated, _, info = env.step(action)
    history += [assistant(action), *obs]
    return obs[-1], float(reward), terminated, info


def is_write(action: str) -> bool:
    return any(f'"name": "{t}"' in action for t in WRITE_TOOLS)


def is_proposal(action: str) -> bool:
    return action.endswith("(yes/no)?")


# ---------------------------------------------------------------- contract and oracle
def test_retail_passes_gymnasium_and_contract_checks() -> None:
    check_multiturn_env(gym.make("srt/Retail-v0"))
    check_multiturn_env(gym.make("srt/Retail-v0", render_mode="ansi"))


def test_oracle_solves_every_task_on_50_seeds() -> None:
    env = gym.make("srt/Retail-v0")
    kinds: Counter[str] = Counter()
    for seed in range(50):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0, (seed, result.final_info)
        assert result.terminated and not result.truncated, seed
        assert result.final_info["db_match"] and result.final_info["missing_info"] == []
        assert STOP in result.transcript[-1].content
        kind = result.task_id.split("-")[1]
        assert result.final_info["task_kind"] == kind  # every info labels the task (per-kind figures)
        kinds[kind] += 1
    assert set(kinds) == {"cancel", "return", "exchange", "info"}, kinds
    _, info = env.reset(seed=3, options={"task_kind": "return"})
    assert info["task_kind"] == "return"


def test_same_seed_same_episode_and_seeds_differ() -> None:
    env = RetailEnv()
    runs = [run_episode(env, oracle_policy, seed=s).transcript for s in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# ---------------------------------------------------------------- domain rules
def test_user_tools_refuse_an_unauthenticated_agent() -> None:
    env = RetailEnv()
    env.reset(seed=0, options={"task_kind": "cancel"})
    before = env.db.model_copy(deep=True)
    order_id = env.task.order_id
    assert order_id is not None
    for call in (
        format_tool_call("get_order_details", {"order_id": order_id}),
        format_tool_call("get_user_details", {"user_id": env.task.user_id}),
        format_tool_call("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"}),
    ):
        obs, _, _, _, info = env.step(call)
        assert obs[0].role == "tool" and "not authenticated" in obs[0].content, obs[0].content
        assert info["tool_errors"] == ["error"] and info["authenticated"] is False
    assert env.db == before
    # Catalogue lookups are not user data and need no authentication.
    obs, *_ = env.step(format_tool_call("list_all_product_types", {}))
    assert not obs[0].content.startswith("Error")


def test_other_users_orders_are_off_limits() -> None:
    env = RetailEnv()
    history, _ = drive(env, 1, "cancel", lambda a: "Which order" in a)
    foreign = next(o for o in env.db.orders.values() if o.user_id != env.task.user_id)
    msg, *_ = step(env, history, format_tool_call("get_order_details", {"order_id": foreign.order_id}))
    assert "does not belong to the authenticated user" in msg.content


def test_cancelling_a_delivered_order_is_refused() -> None:
    env = RetailEnv()
    history, _ = drive(env, 2, "return", is_write)  # the customer has just said yes
    order_id = env.task.order_id
    assert order_id is not None and env.db.orders[order_id].status == "delivered"
    call = format_tool_call("cancel_pending_order", {"order_id": order_id, "reason": "no longer needed"})
    msg, *_ = step(env, history, call)
    assert "only pending orders can be cancelled" in msg.content
    assert env.db.orders[order_id].status == "delivered"


def test_write_without_fresh_confirmation_is_refused() -> None:
    env = RetailEnv()
    history, proposal = drive(env, 3, "return", is_proposal)
    write = env.oracle().act([*history, assistant(proposal), Message(role="user", content="Yes.")])
    assert is_write(write)
    # Before any proposal was answered: refused.
    msg, *_ = step(env, history, write)
    assert "needs the user's explicit confirmation" in msg.content
    # A yes, then another exchange with the customer: the yes has gone stale.
    reply, *_ = step(env, history, proposal)
    assert reply.content.startswith("Yes")
    step(env, history, "Thank you. One moment while I check the item, please.")
    msg, *_ = step(env, history, write)
    assert "needs the user's explicit confirmation" in msg.content
    # A fresh yes works once; a second write on the same yes is refused.
    step(env, history, proposal)
    msg, *_ = step(env, history, write)
    assert '"status":"return requested"' in msg.content
    msg, *_ = step(env, history, write)
    assert "confirmation" in msg.content


def test_customer_says_no_to_a_proposal_that_is_not_the_goal() -> None:
    env = RetailEnv()
    history, proposal = drive(env, 4, "cancel", is_proposal)
    other = "ordered by mistake" if env.task.reason == "no longer needed" else "no longer needed"
    reply, *_ = step(env, history, proposal.replace(f"'{env.task.reason}'", f"'{other}'"))
    assert reply.content.startswith("No") and env.task.reason is not None
    assert "mistake" in reply.content or "no longer need" in reply.content  # the correction
    order_id = env.task.order_id
    msg, *_ = step(
        env, history, format_tool_call("cancel_pending_order", {"order_id": order_id, "reason": other})
    )
    assert "confirmation" in msg.content


def test_exchanges_only_to_available_variants_of_the_same_product() -> None:
    env = RetailEnv()
    env.reset(seed=5, options={"task_kind": "exchange"})
    db, task = env.db.model_copy(deep=True), env.task
    assert task.order_id is not None and task.payment_method_id is not None
    old = db.orders[task.order_id].item(task.item_ids[0])
    assert old is not None
    other_product = next(p for p in db.products.values() if p.product_id != old.product_id)
    with pytest.raises(actions.RetailError, match="is not a variant of"):
        actions.exchange_delivered_order_items(
            db, task.order_id, [old.item_id], [other_product.variants[0].item_id], task.payment_method_id
        )
    variant = next(v for v in db.products[old.product_id].variants if v.item_id != old.item_id)
    variant.available = False
    with pytest.raises(actions.RetailError, match="not available"):
        actions.exchange_delivered_order_items(
            db, task.order_id, [old.item_id], [variant.item_id], task.payment_method_id
        )
    assert db.orders[task.order_id].status == "delivered"  # refused calls change nothing


# ---------------------------------------------------------------- reward
def test_an_exchange_paid_by_a_gift_card_that_cannot_cover_the_difference_is_still_possible() -> None:
    # Seed 485: the order was paid by the user's gift card, whose balance was below the price
    # difference; the task draw tops the card up (before, the goal could not be computed and
    # reset raised, which stopped a 5,000-demo build).
    env = RetailEnv()
    result = run_episode(env, oracle_policy, seed=485, options={"task_kind": "exchange"})
    task = env.task
    payer = env.db.users[task.user_id].payment_method(task.payment_method_id)
    assert payer is not None and payer.kind == "gift_card"
    assert result.total_reward == 1.0, result.final_info


def test_customer_will_not_leave_before_hearing_the_amount_asked_for() -> None:
    env = RetailEnv()
    for seed in range(50):
        history, proposal = drive(env, seed, "return", is_proposal)
        if env.task.wants_amount:
            break
    # Propose without naming the amount, act, and declare victory.
    proposal = re.sub(r"The refund of \$[\d,.]+ will go to", "The refund will go to", proposal)
    reply, *_ = step(env, history, proposal)
    assert reply.content.startswith("Yes")
    step(env, history, env.oracle().act(history))
    reply, reward, terminated, _ = step(env, history, "Done! Is there anything else I can help you with?")
    assert not terminated and "refund" in reply.content and STOP not in reply.content
    amount = env.task.required_info[0].value
    reply, reward, terminated, info = step(env, history, f"You will get ${amount} back. Anything else?")
    assert terminated and reward == 1.0 and STOP in reply.content and info["db_match"] is True


def test_info_check_reads_numbers_leniently() -> None:
    assert {1234.5, 3.0} <= numbers_in("That is $1,234.50 for 3 items.")
    required = [InfoItem(kind="number", value="1234.50", what="total paid")]
    assert missing_info(required, ["You paid 1234.5 dollars."]) == []
    assert missing_info(required, ["You paid 1235 dollars."]) == ["total paid=1234.50"]
    status = [InfoItem(kind="text", value="processed", what="order status")]
    assert missing_info(status, ["It is being PROCESSED."]) == [] and missing_info(status, ["unprocessed"])


# ---------------------------------------------------------------- the simulated customer
def test_customer_reveals_the_order_id_only_when_asked() -> None:
    env = RetailEnv()
    for seed in range(8):
        history, _ = drive(env, seed, "return", lambda a: "Which order" in a)
        order_id = str(env.task.order_id)
        assert all(order_id not in m.content for m in history if m.role == "user")
        reply, *_ = step(env, history, "Hello! How can I help you today?")
        assert "#W" not in reply.content
        reply, *_ = step(env, history, "Which order is this about?")
        assert order_id in reply.content


def test_opening_messages_vary_and_stay_vague() -> None:
    env = RetailEnv()
    openings = []
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        assert [m.role for m in obs] == ["system", "user"]
        text = obs[1].content
        user = env.db.users[env.task.user_id]
        assert "#W" not in text and user.email not in text and user.zip not in text
        openings.append(text)
    assert len(set(openings)) >= 12, openings


def test_identification_follows_the_customers_habit() -> None:
    env = RetailEnv()
    ask = "Could you give me your email address, or your first name, last name and zip code?"
    seen = set()
    for seed in range(12):
        env.reset(seed=seed)
        user = env.db.users[env.task.user_id]
        obs, *_ = env.step(ask)
        reply = obs[0]
        expected = user.email if env.task.prefers_email else user.zip
        assert expected in reply.content
        # Asked only for an email, a name-and-zip customer offers those instead.
        obs, *_ = env.step("What is your email address?")
        assert expected in obs[0].content
        seen.add(env.task.prefers_email)
    assert seen == {True, False}


# ---------------------------------------------------------------- configuration
def test_bad_options_name_the_valid_choices() -> None:
    with pytest.raises(EnvConfigError) as info:
        gym.make("srt/Retail-v0", task_kinds=["refund"])
    assert "'cancel'" in str(info.value) and "task_kinds" in str(info.value)
    with pytest.raises(EnvConfigError, match="num_products"):
        gym.make("srt/Retail-v0", num_products=99)
    with pytest.raises(EnvConfigError, match="duplicates"):
        gym.make("srt/Retail-v0", task_kinds=["cancel", "cancel"])
    with pytest.raises(EnvConfigError) as info:
        gym.make("srt/Retail-v0", num_user=3)
    assert "unknown option 'num_user'" in str(info.value) and "num_users: int" in str(info.value)
    with pytest.raises(ValueError, match="task_kind='refund' is not one of"):
        RetailEnv().reset(seed=0, options={"task_kind": "refund"})


def test_task_kinds_option_restricts_the_draw() -> None:
    env = RetailEnv(task_kinds=["exchange"], num_users=3, num_products=3, max_turns=30)
    for seed in range(5):
        result = run_episode(env, oracle_policy, seed=seed)
        assert env.task.kind == "exchange" and len(env.db.users) == 3 and len(env.db.products) == 3
        assert result.total_reward == 1.0


# ---------------------------------------------------------------- partial credit


def test_progress_counts_the_goals_fields_and_charges_a_wrong_write() -> None:
    db = generate_database(np.random.default_rng(4), 8, 6)
    task = sample_task(np.random.default_rng(5), db, "cancel")
    goal = goal_database(db, task)
    assert task_progress(db, goal, goal, [], []) == 1.0
    assert task_progress(db, goal, db, [], []) == 0.0  # nothing done
    wrong_reason = db.model_copy(deep=True)
    reason = "ordered by mistake" if task.reason == "no longer needed" else "no longer needed"
    actions.cancel_pending_order(wrong_reason, str(task.order_id), reason)
    partly = task_progress(db, goal, wrong_reason, [], [])
    assert 0.0 < partly < 1.0  # status and refund right, reason wrong
    other = next(
        o.order_id for o in db.orders.values() if o.status == "pending" and o.order_id != task.order_id
    )
    wrong_order = db.model_copy(deep=True)
    actions.cancel_pending_order(wrong_order, other, str(task.reason))
    assert task_progress(db, goal, wrong_order, [], []) == 0.0  # fields changed that the goal leaves alone
    fact = InfoItem(kind="number", value="12.5", what="refund")
    assert task_progress(db, db, db, [fact], ["That is $12.50."]) == 1.0
    assert task_progress(db, db, db, [fact], ["That is $12."]) == 0.0


def test_a_wrong_action_gives_reward_zero_or_partial_credit_when_asked() -> None:
    rewards = {}
    for credit in (0.0, 0.5):
        env = RetailEnv(partial_credit=credit)
        history, action = drive(env, 6, "cancel", is_write)
        wrong = "ordered by mistake" if env.task.reason == "no longer needed" else "no longer needed"
        step(env, history, action.replace(str(env.task.reason), wrong))
        oracle = env.oracle()
        reward, terminated, info = 0.0, False, dict[str, object]()
        while not terminated:
            _, reward, terminated, info = step(env, history, oracle.act(history))
        assert info["db_match"] is False and 0.0 < float(info["progress"]) < 1.0  # type: ignore[arg-type]
        assert reward == pytest.approx(credit * float(info["progress"]))  # type: ignore[arg-type]
        assert not env.is_success(reward, info)
        assert env.db.orders[str(env.task.order_id)].cancel_reason == wrong
        rewards[credit] = reward
    assert rewards[0.0] == 0.0 and rewards[0.5] > 0.0


def test_the_turn_limit_pays_partial_credit_for_the_goal_reached() -> None:
    probe = RetailEnv()
    for seed in range(50):
        drive(probe, seed, "cancel", is_write)
        if not probe.task.required_info:
            break
    write_turn = probe.turn + 1
    env = RetailEnv(partial_credit=0.5, max_turns=write_turn)
    _, action = drive(env, seed, "cancel", is_write)
    _, reward, terminated, truncated, info = env.step(action)  # the right write, on the last turn
    assert truncated and not terminated
    assert info["progress"] == 1.0 and reward == 0.5 and not env.is_success(float(reward), info)
    idle = RetailEnv(partial_credit=0.5, max_turns=2)
    idle.reset(seed=seed, options={"task_kind": "cancel"})
    idle.step("How can I help?")
    _, reward, _, truncated, info = idle.step("How can I help?")
    assert truncated and reward == 0.0 and info["progress"] == 0.0


def test_partial_credit_leaves_solved_episodes_at_one() -> None:
    env = gym.make("srt/Retail-v0", partial_credit=0.5)
    for seed in range(8):
        result = run_episode(env, oracle_policy, seed=seed)
        assert result.total_reward == 1.0 and result.final_info["progress"] == 1.0
    with pytest.raises(EnvConfigError, match="partial_credit"):
        gym.make("srt/Retail-v0", partial_credit=1.0)


def test_a_refused_proposal_earns_the_share_of_the_goal_it_got_right() -> None:
    probe = RetailEnv()
    for seed in range(50):  # a return without an amount asked for (the proposal would tell it)
        drive(probe, seed, "return", is_proposal)
        if not probe.task.required_info:
            break
    last = probe.turn + 1  # the proposal is the episode's last turn
    progress = {}
    for case in ("wrong order", "right"):
        env = RetailEnv(partial_credit=0.5, max_turns=last)
        _, proposal = drive(env, seed, "return", is_proposal)
        if case == "wrong order":
            proposal = proposal.replace(str(env.task.order_id), "#W0000000")
        _, reward, _, truncated, info = env.step(proposal)
        assert truncated and reward == pytest.approx(0.5 * float(info["progress"]))
        progress[case] = info["progress"]
    # identified, the proposal (action right, then the order wrong: 1 of 4 details), no write yet
    assert progress["wrong order"] == pytest.approx((1 + 1 / 4 + 0) / 3)
    assert progress["right"] == pytest.approx((1 + 1 + 0) / 3)

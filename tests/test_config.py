"""Run config: defaults, shipped configs, overrides, YAML round trip, flattening."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

import srt_agent.algo as learn
from srt_agent.config import ConfigError, RunConfig, apply_overrides, load_config
from srt_agent.config import algo as config_algo
from srt_agent.config.sections import EVAL_SEED_END
from srt_agent.engine.speculation.spec_config import SpecConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
QUICKSTART = CONFIGS / "quickstart.yaml"


def test_defaults_are_valid_and_equal_an_empty_load() -> None:
    assert load_config() == RunConfig()
    assert load_config(None, []) == RunConfig()


@pytest.mark.parametrize("name", ["quickstart", "ppo", "rloo", "gpu"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.trainer.out_dir == Path("runs") / name
    assert cfg.env.id == "srt/Calculator-v0"


def test_quickstart_is_grpo_with_srt_on_and_fits_one_screen() -> None:
    cfg = load_config(QUICKSTART)
    assert (cfg.algo.estimator, cfg.spec.enabled, cfg.spec.run_ahead.enabled) == ("grpo", True, "auto")
    assert cfg.model.dir == Path("runs/tool-choice-model") and cfg.model.build_if_missing
    assert cfg.model.build_preset == "tool-choice"
    assert cfg.algo.clip_high == 0.28 and cfg.rollout.n == 8
    assert len(QUICKSTART.read_text().splitlines()) <= 50


def test_variants_pick_their_estimators() -> None:
    ppo, rloo = load_config(CONFIGS / "ppo.yaml"), load_config(CONFIGS / "rloo.yaml")
    assert ppo.algo.uses_critic and ppo.algo.epochs == 2 and ppo.algo.kl.mode == "reward"
    assert rloo.algo.estimator == "rloo" and rloo.algo.uses_groups


def test_overrides_are_parsed_as_yaml_scalars() -> None:
    cfg = load_config(
        QUICKSTART,
        [
            "trainer.steps=30",
            "spec.enabled=false",
            "algo.clip_high=0.3",
            "optim.lr=1e-5",  # YAML 1.1 reads this as a string; the loader reads a float (YAML 1.2)
            "optim.betas=[0.9, 0.95]",
            "optim.grad_clip=null",
            "env.options.max_steps=3",
            "model.dir=/tmp/some model",
            "trainer.log=[jsonl, tensorboard]",
        ],
    )
    assert cfg.trainer.steps == 30 and cfg.spec.enabled is False and cfg.algo.clip_high == 0.3
    assert cfg.optim.lr == 1e-5 and cfg.optim.betas == (0.9, 0.95) and cfg.optim.grad_clip is None
    assert cfg.env.options == {"max_steps": 3}
    assert cfg.model.dir == Path("/tmp/some model")
    assert cfg.trainer.log == ("jsonl", "tensorboard")
    assert load_config(QUICKSTART, "trainer.steps=7").trainer.steps == 7  # one string is one override


def test_partial_section_overrides_keep_the_other_defaults() -> None:
    cfg = load_config(None, ["env.eval_seeds.stop=200", "spec.cache.byte_budget=1024"])
    assert (cfg.env.eval_seeds.start, cfg.env.eval_seeds.stop) == (0, 200)
    assert cfg.spec.cache.byte_budget == 1024 and cfg.spec.cache.window == 3


def test_later_files_and_overrides_win_key_by_key() -> None:
    cfg = load_config([QUICKSTART, CONFIGS / "ppo.yaml"], ["algo.lam=0.9"])
    assert cfg.algo.estimator == "gae" and cfg.algo.clip_high == 0.2  # from ppo.yaml
    assert cfg.optim.warmup_steps == 5 and cfg.spec.max_draft_tokens == 8  # from quickstart.yaml
    assert cfg.algo.lam == 0.9 and cfg.trainer.out_dir == Path("runs/ppo")


def test_apply_overrides_leaves_its_input_alone() -> None:
    data = {"trainer": {"steps": 5}}
    out = apply_overrides(data, ["trainer.steps=6", "algo.kl.coef=0.1"])
    assert data == {"trainer": {"steps": 5}}
    assert out == {"trainer": {"steps": 6}, "algo": {"kl": {"coef": 0.1}}}


def test_drgrpo_defaults_to_its_papers_loss_aggregation() -> None:
    assert load_config(None, ["algo.estimator=drgrpo"]).algo.loss_agg == "seq-mean-token-sum-norm"
    explicit = load_config(None, ["algo.estimator=drgrpo", "algo.loss_agg=token-mean"])
    assert explicit.algo.loss_agg == "token-mean"
    assert load_config(None, ["algo.estimator=rloo"]).algo.loss_agg == "token-mean"


def test_yaml_round_trip(tmp_path: Path) -> None:
    cfg = load_config(QUICKSTART, ["env.options.families=[a, b]", "optim.lr=3e-5", "algo.dual_clip=3"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = load_config(path)
    assert again == cfg
    assert again.to_yaml() == cfg.to_yaml()


def test_flat_is_dotted_and_json_safe() -> None:
    flat = load_config(QUICKSTART, ["env.options.max_steps=3"]).flat()
    assert flat["algo.kl.coef"] == 0.0 and flat["spec.cache.byte_budget"] == 268435456
    assert flat["optim.betas"] == [0.9, 0.999] and flat["env.options.max_steps"] == 3
    assert flat["model.dir"] == "runs/tool-choice-model" and flat["trainer.log"] == ["jsonl"]
    assert not any(isinstance(v, dict) for v in flat.values())
    json.dumps(flat)


def test_config_is_frozen() -> None:
    cfg = RunConfig()
    with pytest.raises(ValidationError, match="frozen"):
        cfg.trainer.steps = 3  # type: ignore[misc]


def test_bridges_to_the_rollout_and_engine_configs() -> None:
    cfg = load_config(QUICKSTART, ["env.max_turns=4", "trainer.seed=9", "rollout.top_p=0.9"])
    rollout = cfg.rollout_config()
    assert (rollout.max_turns, rollout.seed, rollout.top_p, rollout.max_new_tokens) == (4, 9, 0.9, 128)
    assert cfg.rollout_config(seed=11).seed == 11
    assert isinstance(cfg.spec, SpecConfig)  # the section is the engines' options: it travels as is
    assert cfg.loss_norm_tokens == 128 and load_config(None, ["algo.norm_tokens=7"]).loss_norm_tokens == 7
    assert cfg.rollout.episodes_per_step == 64


def test_held_out_evaluations_sample_at_their_own_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    from srt_agent.train import rollouts

    assert (
        load_config(QUICKSTART, ["rollout.temperature=0.8"]).eval_temperature == 0.8
    )  # unset: the rollouts'
    cfg = load_config(QUICKSTART, ["rollout.temperature=0.8", "trainer.eval_temperature=0"])
    assert cfg.eval_temperature == 0.0
    with pytest.raises(ConfigError, match="eval_temperature"):
        load_config(QUICKSTART, ["trainer.eval_temperature=-1"])
    seen: dict[str, object] = {}
    monkeypatch.setattr(rollouts, "run_eval", lambda *args, **kw: seen.update(kw))
    side = rollouts.Rollouts.__new__(rollouts.Rollouts)  # no engines: only the call is checked
    side.cfg, side.engine, side.fmt = cfg, None, None
    side.evaluate()
    assert seen["temperature"] == 0.0 and seen["episodes"] == cfg.trainer.eval_episodes
    assert seen["constrain_tool_calls"] is False and seen["copy_tool_arguments"] is False
    # held-out tasks are decoded as the rollouts are: the score is the trained policy's
    side.cfg = load_config(
        QUICKSTART, ["rollout.constrain_tool_calls=true", "rollout.copy_tool_arguments=true"]
    )
    side.evaluate()
    assert seen["constrain_tool_calls"] is True and seen["copy_tool_arguments"] is True


def test_config_names_match_the_learner_and_the_evaluator() -> None:
    assert get_args(config_algo.Estimator) == get_args(learn.Estimator)
    assert get_args(config_algo.LossAgg) == get_args(learn.LossAgg)
    assert get_args(config_algo.KLEstimator) == get_args(learn.KLEstimator)
    assert get_args(config_algo.KLMode) == get_args(learn.KLMode)
    assert get_args(config_algo.RewardPlacement) == get_args(learn.RewardPlacement)
    assert config_algo.GROUP_ESTIMATORS == learn.GROUP_ESTIMATORS
    from srt_agent.evaluation.runner import EVAL_SEED_END as RUNNER_END

    assert EVAL_SEED_END == RUNNER_END


def test_importing_the_config_does_not_import_torch() -> None:
    code = "import sys, srt_agent.config; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_rollout_and_run_ahead_options_are_the_components_own() -> None:
    import subprocess
    import sys

    from srt_agent.config import ConfigError, load_config
    from srt_agent.config.sections import RolloutSection, SpecSection
    from srt_agent.rollout.config import RunAheadConfig

    # Declared once: the section adds only what a training step needs on top of the scheduler's.
    own = set(RolloutSection.__annotations__) - {"model_config"}
    assert own == {"prompts_per_step", "n"}
    assert SpecSection.model_fields["run_ahead"].annotation is RunAheadConfig
    cfg = load_config("configs/quickstart.yaml", ["spec.run_ahead.max_in_flight=2", "rollout.top_k=20"])
    assert cfg.spec.run_ahead == RunAheadConfig(max_in_flight=2) and cfg.rollout_config().top_k == 20
    assert not load_config("configs/quickstart.yaml", ["spec.run_ahead=false"]).spec.run_ahead.enabled
    for bad, message in (
        ("rollout.seed=3", "set by trainer.seed"),
        ("rollout.temperature=0", "> 0 for training"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_config("configs/quickstart.yaml", [bad])
    # Parsing a run config stays light: no torch, no transformers.
    code = (
        "import sys, srt_agent.config as c; c.load_config('configs/quickstart.yaml'); "
        "print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )


def test_env_isolation_is_the_env_sections_and_reaches_the_rollout() -> None:
    cfg = load_config(QUICKSTART, ["env.isolation=process"])
    assert cfg.rollout_config().env_isolation == "process"
    assert load_config(QUICKSTART).rollout_config().env_isolation is None  # each env's registered choice
    with pytest.raises(ConfigError, match=r"rollout.env_isolation is set by env.isolation"):
        load_config(QUICKSTART, ["rollout.env_isolation=process"])

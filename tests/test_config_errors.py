"""Run-config errors: each names the dotted key, the bad value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from srt_agent.config import ConfigError, load_config, read_yaml


def _problems(*overrides: str, paths: list[Path] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(paths, list(overrides))
    return info.value.problems


def test_out_of_range_value_names_key_value_and_range() -> None:
    assert _problems("algo.clip_high=-0.1") == [
        "algo.clip_high = -0.1: Input should be greater than or equal to 0 (allowed: >= 0.0, <= 10.0)"
    ]
    assert _problems("algo.dual_clip=0.5") == [
        "algo.dual_clip = 0.5: Input should be greater than 1 (allowed: > 1.0, or null)"
    ]


def test_inherited_engine_fields_report_their_range() -> None:
    assert _problems("spec.max_draft_tokens=0") == [
        "spec.max_draft_tokens = 0: Input should be greater than or equal to 1 (allowed: >= 1, <= 64)"
    ]


def test_bad_choice_lists_the_choices() -> None:
    assert _problems("algo.estimator=ppo") == [
        "algo.estimator = 'ppo': must be one of gae, grpo, drgrpo, rloo, reinforce_pp, reinforce_pp_baseline"
    ]
    assert _problems("algo.kl.mode=both") == ["algo.kl.mode = 'both': must be one of reward, loss"]
    assert _problems("model.build_preset=big") == [
        "model.build_preset = 'big': must be one of "
        "embedded, tool-choice, retail, retail-base, retail-gpu, reasoning-gym, gpu, gpu-0.5b"
    ]


def test_wrong_type_names_key_and_value() -> None:
    assert _problems("trainer.steps=abc") == ["trainer.steps = 'abc': must be an integer (got str)"]


@pytest.mark.parametrize("value", ["true", '"2"', "2.0"])
def test_an_integer_field_takes_only_an_integer(value: str, tmp_path: Path) -> None:
    shown = {"true": "True", '"2"': "'2'", "2.0": "2.0"}[value]
    got = {"true": "bool", '"2"': "str", "2.0": "float"}[value]
    expected = [f"trainer.steps = {shown}: must be an integer (got {got})"]
    assert _problems(f"trainer.steps={value}") == expected
    path = tmp_path / "run.yaml"
    path.write_text(f"trainer:\n  steps: {value}\n")
    assert _problems(paths=[path]) == expected
    assert load_config(None, ["trainer.steps=5"]).trainer.steps == 5


def test_types_are_strict_and_errors_name_the_type() -> None:
    assert _problems("trainer.threads=x") == ["trainer.threads = 'x': must be an integer or null (got str)"]
    assert _problems("spec.enabled=1") == ["spec.enabled = 1: must be a boolean (true or false) (got int)"]
    assert _problems('spec.enabled="yes"') == [
        "spec.enabled = 'yes': must be a boolean (true or false) (got str)"
    ]
    assert _problems("env.id=5") == ["env.id = 5: must be a string (got int)"]
    assert _problems("optim.lr=true") == ["optim.lr = True: must be a number (got bool)"]
    assert _problems('optim.lr="0.001"') == ["optim.lr = '0.001': must be a number (got str)"]
    assert _problems("optim.betas=[0.9, x]") == ["optim.betas.1 = 'x': must be a number (got str)"]
    assert _problems("trainer.out_dir=5") == ["trainer.out_dir = 5: must be a path (got int)"]
    assert _problems("trainer.log=jsonl") == ["trainer.log = 'jsonl': must be a list (got str)"]
    # Sections composed from other packages' models are strict too.
    assert _problems("engine.retries=true") == ["engine.retries = True: must be an integer (got bool)"]
    assert _problems("ray.replicas=2.0") == ["ray.replicas = 2.0: must be an integer (got float)"]
    assert _problems('spec.cache.window="3"') == ["spec.cache.window = '3': must be an integer (got str)"]
    assert _problems("spec.run_ahead.max_in_flight=true") == [
        "spec.run_ahead.max_in_flight = True: must be an integer (got bool)"
    ]
    assert _problems("rollout.top_k=1.0") == ["rollout.top_k = 1.0: must be an integer (got float)"]
    assert _problems("spec.max_draft_tokens=false") == [
        "spec.max_draft_tokens = False: must be an integer (got bool)"
    ]


def test_number_fields_take_integers_and_floats(tmp_path: Path) -> None:
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0
    assert type(load_config(None, ["optim.lr=1"]).optim.lr) is float
    assert load_config(None, ["optim.lr=0.001"]).optim.lr == 0.001
    assert load_config(None, ["optim.lr=1e-4", "engine.timeout_s=30"]).optim.lr == 1e-4
    path = tmp_path / "run.yaml"
    # YAML 1.1 reads 1e-4 and 2.5e3 as strings: the loader reads them as floats (YAML 1.2).
    path.write_text("optim:\n  lr: 1e-4\n  eps: 1.0e-6\ntrainer:\n  time_limit_s: 2.5e3\n")
    assert read_yaml(path) == {"optim": {"lr": 1e-4, "eps": 1e-6}, "trainer": {"time_limit_s": 2500.0}}
    cfg = load_config(path)
    assert (cfg.optim.lr, cfg.optim.eps, cfg.trainer.time_limit_s) == (1e-4, 1e-6, 2500.0)


def test_unknown_key_suggests_the_closest_one() -> None:
    assert _problems("algo.clip_hihg=0.3") == [
        "algo.clip_hihg = 0.3: unknown key; did you mean algo.clip_high?"
    ]
    assert _problems("spec.cache.byte_budgt=1") == [
        "spec.cache.byte_budgt = 1: unknown key; did you mean spec.cache.byte_budget?"
    ]
    assert _problems("algorithm.estimator=rloo") == [
        "algorithm = {'estimator': 'rloo'}: unknown key; did you mean algo?"
    ]


def test_key_in_the_wrong_section_points_to_the_right_one() -> None:
    assert _problems("trainer.lr=0.1") == ["trainer.lr = 0.1: unknown key; did you mean optim.lr?"]


def test_unknown_key_without_a_close_match_lists_the_valid_ones() -> None:
    (problem,) = _problems("trainer.zzz=1")
    assert problem.startswith("trainer.zzz = 1: unknown key; valid keys of trainer: steps, eval_every,")


def test_every_problem_is_reported_at_once_with_its_source(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("algo:\n  clip_low: 2\n  estimatr: grpo\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["optim.lr=0"])
    message = str(info.value)
    assert message.startswith(f"invalid run config ({path}, override optim.lr=0):\n")
    assert "  algo.clip_low = 2: Input should be less than 1 (allowed: >= 0.0, < 1.0)" in message
    assert "  algo.estimatr = 'grpo': unknown key; did you mean algo.estimator?" in message
    assert "  optim.lr = 0: Input should be greater than 0 (allowed: > 0.0, <= 1.0)" in message


def test_checks_across_sections_name_their_keys() -> None:
    assert _problems("rollout.n=1") == [
        "rollout.n = 1: algo.estimator 'grpo' compares the samples of a prompt, so it needs rollout.n >= 2"
    ]
    assert _problems("env.train_seeds.start=500") == [
        "env.train_seeds = [500, 10000000): overlaps env.eval_seeds [0, 1000); held-out tasks must not be "
        "trained on"
    ]
    assert _problems("algo.overlong.enabled=true", "algo.overlong.buffer_tokens=300") == [
        "algo.overlong.buffer_tokens = 300: must be <= rollout.max_new_tokens (256)"
    ]
    assert _problems(
        "env.eval_seeds.stop=20000000", "env.train_seeds.start=30000000", "env.train_seeds.stop=40000000"
    ) == [
        "env.eval_seeds.stop = 20000000: must be <= 10000000 "
        "(higher seeds are the model builder's demonstrations)"
    ]


def test_section_checks_name_the_section_and_value() -> None:
    assert _problems("env.eval_seeds.start=300", "env.eval_seeds.stop=200") == [
        "env.eval_seeds = {'start': 300, 'stop': 200}: start (300) must be < stop (200)"
    ]
    assert _problems("optim.betas=[0.9, 1.5]") == [
        "optim.betas = [0.9, 1.5]: each beta must be in [0, 1), got [0.9, 1.5]"
    ]


def test_malformed_overrides() -> None:
    assert _problems("trainer.steps") == [
        "override 'trainer.steps': expected dotted.key=value, e.g. trainer.steps=30"
    ]
    assert _problems("trainer..steps=3") == [
        "override 'trainer..steps=3': expected dotted.key=value, e.g. trainer.steps=30"
    ]
    assert _problems("trainer.steps=30", "trainer.steps.max=1") == [
        "override 'trainer.steps.max=1': trainer.steps is a value (30), not a section"
    ]
    (problem,) = _problems("trainer.log=[jsonl")
    assert problem.startswith("override 'trainer.log=[jsonl': the value is not valid YAML")


def test_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert _problems(paths=[missing]) == [f"{missing}: no such file"]
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    assert _problems(paths=[listing]) == [f"{listing}: the top level must be a mapping of sections, got list"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("algo: [\n")
    (problem,) = _problems(paths=[broken])
    assert problem.startswith(f"{broken}: not valid YAML")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == load_config()

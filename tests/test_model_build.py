import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from model_fixtures import TINY
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import srt_agent.recipe.build as build_mod
from srt_agent.chat.template import ChatFormat
from srt_agent.recipe import BuildDirError, build_model, ensure_model, is_model_dir
from srt_agent.recipe.build import (
    BUILD_FILE,
    PRESETS,
    SHIPPED,
    SHIPPED_DIR,
    BuildConfig,
    preset_config,
    shipped_build,
)
from srt_agent.recipe.demos import DemoSource, demo_digest


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models gain nothing from threads; on a busy 2-core machine waiting threads slow them badly.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    build_model(out, seed=0, config=TINY, show_progress=False)
    return out


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_tiny_build_saves_a_loadable_hf_directory(tiny_dir: Path) -> None:
    assert is_model_dir(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == len(tok) and model.config.hidden_size == TINY.hidden_size
    assert model.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tok.pad_token_id == 0
    # The chat template travels inside tokenizer_config.json (readable by transformers 4.x too).
    assert "chat_template" in json.loads((tiny_dir / "tokenizer_config.json").read_text())
    fmt = ChatFormat(tok)
    assert fmt.stop_token_ids[0] == tok.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([fmt.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))


def test_build_metadata_records_the_figures(tiny_dir: Path) -> None:
    meta = json.loads((tiny_dir / BUILD_FILE).read_text())
    assert meta["seed"] == 0 and meta["steps"] == TINY.sft.steps
    assert meta["demos"] == {"srt/Calculator-v0": 12, "srt/GuessNumber-v0": 4, "srt/Retail-v0": 2}
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert meta["params"] == sum(p.numel() for p in model.parameters())
    assert 0 < meta["loss_tokens"] < meta["tokens_trained"]
    assert meta["seq_len"]["srt/Retail-v0"]["max"] <= meta["context"]
    assert {"torch", "transformers", "tokenizers", "srt_agent"} <= set(meta["versions"])
    # The CPU kind decides bit-for-bit reproducibility: the build says which it ran on.
    assert meta["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert meta["machine"]["threads"] == TINY.threads and meta["machine"]["device"] == "cpu"
    assert meta["machine"]["cpu"]
    assert meta["seconds"] > 0 and meta["final_loss"] > 0
    assert 0 < meta["sft_seconds"] < meta["seconds"]
    assert meta["sft_tflops"] == pytest.approx(
        6 * meta["params"] * meta["tokens_trained"] / meta["sft_seconds"] / 1e12, rel=0.05
    )


def test_refusal_force_determinism_and_rebuild(tiny_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BuildDirError, match="--force"):
        build_model(out, config=TINY, show_progress=False)
    assert not is_model_dir(out)
    with pytest.raises(BuildDirError, match="not a directory"):
        build_model(out / "notes.txt", config=TINY, show_progress=False)
    # Forced into the foreign directory: same seed, same weights and tokenizer as the fixture's build.
    build_model(out, seed=0, config=TINY, force=True, show_progress=False)
    assert is_model_dir(out) and (out / "notes.txt").read_text() == "mine"
    a, b = _weights(tiny_dir), _weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tiny_dir / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()
    # A previous build is replaced without --force; another seed gives other weights.
    report = build_model(out, seed=1, config=TINY, show_progress=False)
    assert report.seed == 1 and json.loads((out / BUILD_FILE).read_text())["seed"] == 1
    c = _weights(out)
    assert not all(a[k].shape == c[k].shape and torch.equal(a[k], c[k]) for k in a)


def test_ensure_model_builds_only_when_missing(
    tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_build(out: Path, **kwargs: object) -> None:
        calls.append(Path(out))

    monkeypatch.setattr(build_mod, "build_model", fake_build)
    assert ensure_model(tiny_dir) == tiny_dir and calls == []
    ensure_model(tmp_path / "fresh")
    assert calls == [tmp_path / "fresh"]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x").write_text("x")
    monkeypatch.undo()
    with pytest.raises(BuildDirError):
        ensure_model(tmp_path / "junk")


def test_context_too_small_for_the_demos_is_reported(tmp_path: Path) -> None:
    cfg = BuildConfig(**{**TINY.__dict__, "demos": (("srt/GuessNumber-v0", 2),), "context": 64})
    with pytest.raises(ValueError, match="raise context"):
        build_model(tmp_path / "m", config=cfg, show_progress=False)


def test_a_build_records_each_demonstrator_of_an_env_apart(tmp_path: Path) -> None:
    cfg = replace(TINY, demos=(("srt/Calculator-v0", 4), ("srt/Calculator-v0", 3, "mental")))
    assert cfg.demos[1] == DemoSource("srt/Calculator-v0", 3, "mental")  # plain tuples are normalised
    build_model(tmp_path / "m", config=cfg, show_progress=False)
    meta = json.loads((tmp_path / "m" / BUILD_FILE).read_text())
    assert meta["demos"] == {"srt/Calculator-v0": 4, "srt/Calculator-v0/mental": 3}
    # One short turn each: the tool-free demonstrations are shorter than the oracle's.
    assert meta["seq_len"]["srt/Calculator-v0/mental"]["mean"] < meta["seq_len"]["srt/Calculator-v0"]["mean"]
    with pytest.raises(ValueError, match="unknown demonstrator 'guess'"):
        replace(TINY, demos=(("srt/Calculator-v0", 4, "guess"),))


def test_demo_sources_pass_their_env_options_to_make(tmp_path: Path) -> None:
    two_steps_each = {"min_steps": 2, "max_steps": 2, "max_turns": 5}
    cfg = replace(TINY, demos=(DemoSource("srt/Calculator-v0", 4, "oracle", two_steps_each),))
    build_model(tmp_path / "m", config=cfg, show_progress=False)
    meta = json.loads((tmp_path / "m" / BUILD_FILE).read_text())
    assert meta["demos"] == {"srt/Calculator-v0": 4}
    from srt_agent.recipe.demos import collect_demos

    two_steps = collect_demos("srt/Calculator-v0", 4, options=two_steps_each)
    assert all(len(d.turns) == 3 for d in two_steps)  # two calculator calls, then the answer


def test_cut_sources_keep_the_first_turns_and_drills_train_alone_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import srt_agent.recipe.build as build_module
    from srt_agent.recipe.demos import collect_demos

    full = collect_demos("srt/Retail-v0", 2)
    cut = collect_demos("srt/Retail-v0", 2, turns=2)
    assert [d.turns[:1] for d in cut] == [d.turns[:1] for d in full]  # the same oracle turns ...
    assert all(len(d.turns) == 2 and d.turns[-1].observation == () for d in cut)  # ... cut after two
    assert DemoSource("srt/Retail-v0", 2, turns=2).label == "srt/Retail-v0/first2"
    phases: list[set[str]] = []
    real_train = build_module.train

    rates: list[float] = []

    def recording_train(model, examples, cfg, **kwargs):  # type: ignore[no-untyped-def]
        phases.append({e.group for e in examples})
        rates.append(cfg.lr)
        return real_train(model, examples, cfg, **kwargs)

    monkeypatch.setattr(build_module, "train", recording_train)
    cfg = replace(
        TINY,
        demos=(
            ("srt/Calculator-v0", 4),
            DemoSource("srt/Calculator-v0", 6, turns=1),
            DemoSource("srt/RetailCopy-v0", 5, drill=True),
        ),
        drill_steps=3,
        drill_lr=TINY.sft.lr * 2,
    )
    build_model(tmp_path / "m", config=cfg, show_progress=False)
    meta = json.loads((tmp_path / "m" / BUILD_FILE).read_text())
    assert meta["demos"] == {"srt/Calculator-v0": 4, "srt/Calculator-v0/first1": 6, "srt/RetailCopy-v0": 5}
    assert meta["steps"] == 3 + TINY.sft.steps  # the drill phase, then every source
    # The drill alone first (a cut source is not a drill), then every source.
    assert phases == [
        {"srt/RetailCopy-v0"},
        {"srt/Calculator-v0", "srt/Calculator-v0/first1", "srt/RetailCopy-v0"},
    ]
    assert rates == [TINY.sft.lr * 2, TINY.sft.lr]  # the drill at its own rate
    with pytest.raises(ValueError, match="needs a drill source"):
        replace(TINY, drill_steps=3, demos=(DemoSource("srt/Calculator-v0", 4, turns=1),))
    with pytest.raises(ValueError, match=r"drill_lr=0\.001 needs drill_steps > 0"):
        replace(TINY, drill_lr=1e-3)
    with pytest.raises(ValueError, match="turns=0"):
        replace(TINY, demos=(DemoSource("srt/Calculator-v0", 4, turns=0),))


def test_a_finishing_stage_trains_its_sources_last_and_changes_nothing_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srt_agent.recipe.sft import SFTConfig

    phases: list[tuple[set[str], float]] = []
    real_train = build_mod.train

    def recording_train(model, examples, cfg, **kwargs):  # type: ignore[no-untyped-def]
        phases.append(({e.group for e in examples}, cfg.lr))
        return real_train(model, examples, cfg, **kwargs)

    monkeypatch.setattr(build_mod, "train", recording_train)
    main = (("srt/Calculator-v0", 4), DemoSource("srt/GuessNumber-v0", 3))
    finishing = DemoSource("srt/Calculator-v0", 2, turns=1, finish=True)  # tasks of its own
    assert finishing.label == "srt/Calculator-v0/first1/finish"
    cfg = replace(TINY, demos=(*main, finishing), finish=SFTConfig(steps=2, batch_tokens=4096, lr=1e-4))
    build_model(tmp_path / "finished", config=cfg, show_progress=False)
    meta = json.loads((tmp_path / "finished" / BUILD_FILE).read_text())
    assert meta["steps"] == TINY.sft.steps + 2
    assert meta["demos"] == {"srt/Calculator-v0": 4, "srt/GuessNumber-v0": 3, finishing.label: 2}
    assert (
        DemoSource("srt/Retail-v0", 2, "refused-long", finish=True).label
        == "srt/Retail-v0/refused-long/finish"
    )
    # The main stage without the finishing source, then the finishing source alone at its own rate.
    assert phases == [
        ({"srt/Calculator-v0", "srt/GuessNumber-v0"}, TINY.sft.lr),
        ({finishing.label}, 1e-4),
    ]
    # The tokenizer is trained without it: the same as a build with no finishing stage.
    build_model(tmp_path / "plain", config=replace(TINY, demos=main), show_progress=False)
    tokenizer = "tokenizer.json"
    assert (tmp_path / "finished" / tokenizer).read_text() == (tmp_path / "plain" / tokenizer).read_text()
    # ... and the finishing stage changes the weights the main stage gave.
    finished, plain = _weights(tmp_path / "finished"), _weights(tmp_path / "plain")
    assert any(not torch.equal(finished[k], plain[k]) for k in plain)


def test_a_finishing_stage_and_its_sources_come_together() -> None:
    from srt_agent.recipe.sft import SFTConfig

    finishing = DemoSource("srt/Retail-v0", 2, finish=True)
    with pytest.raises(ValueError, match="needs a finishing source"):
        replace(TINY, finish=SFTConfig(steps=2))
    with pytest.raises(ValueError, match="no finishing stage"):
        replace(TINY, demos=(("srt/Calculator-v0", 4), finishing))
    with pytest.raises(ValueError, match="main stage needs"):
        replace(TINY, demos=(finishing,), finish=SFTConfig(steps=2))
    with pytest.raises(ValueError, match="both a drill and a finishing"):
        replace(TINY, demos=(("srt/Calculator-v0", 4), finishing._replace(drill=True)))


def test_a_build_continued_from_a_base_is_the_full_build_with_its_finishing_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srt_agent.recipe.demos import source_seeds
    from srt_agent.recipe.sft import SFTConfig

    main = (("srt/Calculator-v0", 4), DemoSource("srt/GuessNumber-v0", 3))
    finishing = DemoSource("srt/Calculator-v0", 2, turns=1, finish=True)
    stage = SFTConfig(steps=2, batch_tokens=4096, lr=1e-4)
    base = replace(TINY, demos=main)
    monkeypatch.setitem(build_mod.PRESETS, "tiny-base", base)
    based = replace(base, demos=(finishing,), finish=stage, base="tiny-base")
    report = build_model(tmp_path / "based", seed=1, config=based, show_progress=False)
    build_model(tmp_path / "full", seed=1, config=replace(base, demos=(*main, finishing), finish=stage))
    build_model(tmp_path / "base", seed=1, config=base, show_progress=False)
    # The base's weights and tokenizer, then the stage alone: the full build's weights bit for bit.
    got, full = _weights(tmp_path / "based"), _weights(tmp_path / "full")
    assert got.keys() == full.keys() and all(torch.equal(got[k], full[k]) for k in full)
    assert any(not torch.equal(got[k], v) for k, v in _weights(tmp_path / "base").items())
    tokenizer = "tokenizer.json"
    assert (tmp_path / "based" / tokenizer).read_text() == (tmp_path / "base" / tokenizer).read_text()
    # Its tasks follow the base's (none trained twice), and the record names the base it started from.
    assert source_seeds((finishing,), 1, after=base.demos) == source_seeds((*base.demos, finishing), 1)[2:]
    assert source_seeds((finishing,), 1, after=base.demos)[0].start == source_seeds(base.demos, 1)[0].stop
    meta = json.loads((tmp_path / "based" / BUILD_FILE).read_text())
    assert meta["base"] == report.base == "tiny-base" and meta["steps"] == 2
    assert meta["base_sha256"] == build_mod._sha256(tmp_path / "base" / "model.safetensors")
    assert meta["demos"] == {finishing.label: 2}
    # A config that changes more than the stage is refused, naming the field.
    with pytest.raises(ValueError, match="hidden_size differ from the base preset's"):
        build_model(tmp_path / "wide", config=replace(based, hidden_size=64), show_progress=False)


def test_a_base_needs_a_finishing_stage_alone() -> None:
    from srt_agent.recipe.sft import SFTConfig

    finishing = DemoSource("srt/Retail-v0", 2, finish=True)
    stage = SFTConfig(steps=2)
    with pytest.raises(ValueError, match="needs finish=SFTConfig"):
        replace(TINY, demos=(finishing,), base="retail-base")
    with pytest.raises(ValueError, match=r"lack finish=True: \['srt/Calculator-v0'\]"):
        replace(TINY, demos=(("srt/Calculator-v0", 4), finishing), finish=stage, base="retail-base")
    with pytest.raises(ValueError, match="needs a drill source"):  # a finishing source is no drill
        replace(TINY, demos=(finishing,), finish=stage, base="retail-base", drill_steps=5)
    with pytest.raises(ValueError, match="unknown build preset 'nope'"):
        replace(TINY, demos=(finishing,), finish=stage, base="nope").base_config()
    assert preset_config("retail").base_config() == preset_config("retail-base")
    # The stage may run at another thread count: the base is built (or was shipped) at its own.
    assert replace(preset_config("retail"), threads=1).base_config() == preset_config("retail-base")


def test_a_bad_demo_source_fails_the_build_before_any_work(tmp_path: Path) -> None:
    from srt_agent.env.multi_turn import EnvConfigError
    from srt_agent.env.registration import UnknownEnvError

    bad_option = replace(TINY, demos=(DemoSource("srt/Calculator-v0", 4, "oracle", {"max_stepz": 2}),))
    with pytest.raises(EnvConfigError, match="max_stepz"):
        build_model(tmp_path / "m", config=bad_option, show_progress=False)
    with pytest.raises(UnknownEnvError, match="srt/Calculater-v0"):
        build_model(
            tmp_path / "m", config=replace(TINY, demos=(("srt/Calculater-v0", 4),)), show_progress=False
        )
    assert not (tmp_path / "m").exists()


def test_the_reasoning_gym_preset_names_its_extra_when_missing(tmp_path: Path) -> None:
    import importlib.util

    from srt_agent.env.registration import UnknownEnvError

    if importlib.util.find_spec("reasoning_gym") is not None:
        pytest.skip("reasoning-gym is installed (its tier builds from this preset's demonstrations)")
    with pytest.raises(UnknownEnvError, match=r"pip install 'srt-agent\[reasoning-gym\]'"):
        build_model(tmp_path / "m", config=preset_config("reasoning-gym"), show_progress=False)


def test_the_reasoning_gym_config_trains_on_what_its_preset_demonstrates() -> None:
    import yaml

    from srt_agent.recipe.build import REASONING_GYM_ARITHMETIC

    config = yaml.safe_load((Path(__file__).parents[1] / "configs" / "reasoning_gym.yaml").read_text())
    assert config["model"]["build_preset"] == "reasoning-gym"
    assert config["env"]["id"] == preset_config("reasoning-gym").demos[0].env_id
    assert config["env"]["options"] == REASONING_GYM_ARITHMETIC


def test_the_retail_config_trains_the_retail_preset_on_its_env() -> None:
    from srt_agent.config import load_config

    config = load_config(Path(__file__).parents[1] / "configs" / "retail.yaml")
    assert config.model.build_preset == "retail" and config.env.id == "srt/Retail-v0"
    assert config.model.build_seed == SHIPPED["retail"].seed  # the shipped build: copied, not built
    assert config.rollout.constrain_tool_calls and config.rollout.copy_tool_arguments  # its best decoding
    assert config.env.oracle_prefix == 0.8  # the reverse curriculum: it kept the build and its turns readable
    # The shipped retail-base build, continued by a finishing stage on long refused-proposal
    # conversations at a fraction of its rate.
    retail, base = preset_config("retail"), preset_config("retail-base")
    assert retail.base == "retail-base" and retail.finish is not None and all(s.finish for s in retail.demos)
    assert retail.finish.lr < base.sft.lr / 5 and "refused-long" in {s.demonstrator for s in retail.demos}
    assert {s.env_id for s in base.demos} == {"srt/Retail-v0", "srt/RetailCopy-v0"}
    assert [s.env_id for s in base.demos if s.drill] == ["srt/RetailCopy-v0"]
    # Half its conversations recover from a misread request, half from refused proposals.
    main = [s for s in base.demos if s.env_id == "srt/Retail-v0" and not s.turns and not s.finish]
    assert sorted((s.demonstrator, s.episodes) for s in main) == [
        ("misread", 2500),
        ("refused", 2500),
    ]
    gpu = load_config(Path(__file__).parents[1] / "configs" / "retail-gpu.yaml")
    assert gpu.model.build_preset == "retail-gpu" and gpu.env.id == "srt/Retail-v0"
    assert gpu.trainer.device == "cuda" and preset_config("retail-gpu").sft.device == "cuda"
    assert gpu.rollout.constrain_tool_calls and gpu.rollout.copy_tool_arguments  # the same decoding
    assert (
        config.eval_temperature == gpu.eval_temperature == 0.0
    )  # held-out pass^1 is greedy, as in tau-bench
    assert preset_config("retail-gpu").drill_steps > 0  # its copying drill is trained first
    # The GPU build finishes on long conversations of up to 18 refused proposals, at a fraction of
    # the main rate.
    gpu_preset = preset_config("retail-gpu")
    assert gpu_preset.finish is not None and gpu_preset.finish.lr < gpu_preset.sft.lr / 5
    assert "refused-long" in {s.demonstrator for s in gpu_preset.demos if s.finish}


def test_presets_match_the_run_config_choices() -> None:
    from typing import get_args

    from srt_agent.config.sections import ModelSection

    assert set(get_args(ModelSection.model_fields["build_preset"].annotation)) == set(PRESETS)
    assert PRESETS["embedded"] == BuildConfig()
    assert {s.label for s in preset_config("tool-choice").demos} >= {"srt/Calculator-v0/mental"}
    with pytest.raises(ValueError, match="unknown build preset 'big'; choose from embedded, tool-choice"):
        preset_config("big")


def test_the_gpu_05b_preset_has_qwen25_05b_shape_and_builds_with_grouped_query_attention(
    tmp_path: Path,
) -> None:
    big = preset_config("gpu-0.5b")
    shape = (big.hidden_size, big.num_layers, big.num_heads, big.num_kv_heads, big.intermediate_size)
    assert shape == (896, 24, 14, 2, 4864) and big.sft.bf16 and big.sft.device == "cuda"
    # The same preset shrunk to run here: 4 query heads over 2 key/value heads, loaded by the engine.
    small = BuildConfig(**{**TINY.__dict__, "num_heads": 4, "num_kv_heads": 2})
    build_model(tmp_path / "gqa", seed=0, config=small, show_progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "gqa")
    assert model.config.num_key_value_heads == 2 and model.config.num_attention_heads == 4
    from srt_agent.contracts.generation import GenerationRequest, SamplingParams
    from srt_agent.engine.torch_engine import TorchEngine

    with TorchEngine(tmp_path / "gqa", max_batch_size=2) as engine:
        out = engine.generate([GenerationRequest("q", (5, 6, 7), SamplingParams(seed=0, max_new_tokens=4))])
    assert len(out[0].token_ids) >= 1 and engine.config.num_kv_heads == 2


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["embedded", "tool-choice"])
def test_preset_builds_fit_the_quickstart_budget_and_record_metadata(preset: str, tmp_path: Path) -> None:
    cfg = preset_config(preset)
    report = build_model(tmp_path / preset, seed=0, config=cfg, show_progress=False)
    meta = json.loads((tmp_path / preset / BUILD_FILE).read_text())
    # The RL quickstart has 10 minutes on 2 cores, build included; its training takes ~2.5 of them.
    assert report.seconds <= 420, f"{preset} build took {report.seconds:.0f}s, over the 7-minute budget"
    assert meta["seconds"] == report.seconds and meta["steps"] == cfg.sft.steps
    assert meta["demos"] == {s.label: s.episodes for s in cfg.demos}
    assert 300_000 <= meta["params"] <= 10_000_000
    assert meta["final_loss"] < 1.0
    assert all(s["max"] <= meta["context"] for s in meta["seq_len"].values())
    model = AutoModelForCausalLM.from_pretrained(tmp_path / preset)
    assert sum(p.numel() for p in model.parameters()) == meta["params"]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a whole build: the default 120 s would stop every preset's
@pytest.mark.parametrize("preset", sorted(SHIPPED))
def test_a_shipped_build_is_its_presets_build_bit_for_bit(preset: str, tmp_path: Path) -> None:
    # Same machine kind, 2 threads (the preset's): retail-base's build takes ~30 minutes on 2 cores.
    build_model(
        tmp_path / preset, seed=SHIPPED[preset].seed, config=preset_config(preset), show_progress=False
    )
    assert _weights(tmp_path / preset).keys() == _weights(SHIPPED_DIR / preset).keys()
    for name, tensor in _weights(tmp_path / preset).items():
        assert torch.equal(tensor, _weights(SHIPPED_DIR / preset)[name]), name
    shipped_tok = (SHIPPED_DIR / preset / "tokenizer.json").read_text()
    assert (tmp_path / preset / "tokenizer.json").read_text() == shipped_tok


@pytest.mark.parametrize("preset", sorted(SHIPPED))
def test_a_shipped_model_is_intact_and_records_its_recipe(preset: str) -> None:
    path, seed, cfg = SHIPPED_DIR / preset, SHIPPED[preset].seed, preset_config(preset)
    assert is_model_dir(path)
    assert shipped_build(cfg, seed=seed) == path  # the checksum holds
    meta = json.loads((path / BUILD_FILE).read_text())
    finish_steps = cfg.finish.steps if cfg.finish is not None else 0
    base = cfg.base_config()
    main_steps = 0 if base is not None else cfg.drill_steps + cfg.sft.steps  # a base's steps are its own
    assert meta["seed"] == seed and meta["steps"] == main_steps + finish_steps
    assert meta["demos"] == {s.label: s.episodes for s in cfg.demos}
    assert shipped_build(cfg, seed=seed + 1) is None  # another seed is built
    # The envs and demonstrators still play the demonstrations it was built from (a rebuild would
    # give the same weights): otherwise rebuild it with `srt-agent build-model --preset P --seed S`
    # and record the new checksum and digest in SHIPPED.
    after = base.demos if base is not None else ()
    assert demo_digest(cfg.demos, seed, read_system=cfg.read_system, after=after) == SHIPPED[preset].demos
    assert shipped_build(preset_config("embedded"), seed=0) is None
    if base is not None:  # continued from the shipped build of its base, whose weights it records
        assert meta["base"] == cfg.base and SHIPPED[meta["base"]].sha256 == meta["base_sha256"]


def test_ensure_model_copies_a_shipped_build_and_builds_when_it_is_altered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Path] = []
    monkeypatch.setattr(build_mod, "build_model", lambda out, **kw: built.append(Path(out)))
    out = ensure_model(tmp_path / "m", config=preset_config("tool-choice"), show_progress=False)
    assert built == [] and is_model_dir(out)
    assert _weights(out).keys() == _weights(SHIPPED_DIR / "tool-choice").keys()
    assert json.loads((out / BUILD_FILE).read_text())["out_dir"] == str(out)
    ChatFormat.from_pretrained(out)  # the tokenizer and its chat template load
    monkeypatch.setitem(build_mod.SHIPPED, "tool-choice", build_mod.ShippedBuild(0, "0" * 64, ""))  # altered
    ensure_model(tmp_path / "n", config=preset_config("tool-choice"), show_progress=False)
    assert built == [tmp_path / "n"]
    ensure_model(tmp_path / "o", config=preset_config("tool-choice"), show_progress=False, use_shipped=False)
    assert built[-1] == tmp_path / "o"

"""The SRT plugin against the real classes of the pinned SGLang (``sglang==0.5.23``, CPU import).

Runs in the ``sglang`` tier (``pytest -m sglang``) after ``.ci/sglang-install``, which installs
SGLang without its CUDA dependencies and stubs only the compiled ``sgl_kernel``. Every test checks
one thing the plugin relies on; its message names the SGLang change that broke it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.sglang
ngram_worker = pytest.importorskip(
    "sglang.srt.speculative.ngram_worker", reason="the sglang tier needs sglang"
)

from sglang.srt.speculative import spec_info, spec_registry  # noqa: E402

from srt_agent.integrations.sglang import plugin  # noqa: E402
from srt_agent.integrations.sglang.corpus import TreeCacheCorpus  # noqa: E402

D = 8


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _srt() -> Any:
    plugin.register()
    algo = spec_registry.get_spec(plugin.ALGORITHM)
    assert algo is not None, "SpeculativeAlgorithm.register no longer files SRT in spec_registry"
    return algo


def test_the_version_is_the_pinned_one() -> None:
    assert importlib.metadata.version("sglang") == "0.5.23", "update the pin, docs/sglang.md and this tier"


def test_sglangs_plugin_loader_registers_srt_through_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt import plugins

    monkeypatch.setenv("SGLANG_PLUGINS", "srt")
    monkeypatch.setattr(plugins, "_plugins_loaded", False)
    plugins.load_plugins()
    algo = spec_info.SpeculativeAlgorithm.from_string("srt")  # --speculative-algorithm srt
    assert isinstance(algo, spec_registry.CustomSpecAlgo), "from_string no longer resolves registered names"
    assert type(algo).__name__ == "SRTAlgorithm"


def test_the_algorithm_has_every_method_sglangs_built_in_algorithms_have() -> None:
    algo = _srt()
    enum_methods = {
        name
        for name, member in vars(spec_info.SpeculativeAlgorithm).items()
        if callable(member) and not name.startswith("_") and name not in ("register", "from_string")
    }
    missing = sorted(m for m in enum_methods if not callable(getattr(algo, m, None)))
    assert not missing, f"SpeculativeAlgorithm gained methods the SRT algorithm lacks: {missing}"
    assert algo.is_ngram() and not algo.has_draft_kv() and not algo.carries_draft_hidden_states()


def test_the_future_map_and_worker_factory_take_what_the_plugin_passes() -> None:
    from sglang.srt.managers.overlap_utils import FutureMap

    inspect.signature(FutureMap).bind("cpu", _srt(), None, True, False)  # create_future_map's call
    worker = _srt().create_worker(SimpleNamespace(disable_overlap_schedule=True))
    assert issubclass(worker, ngram_worker.NGRAMWorker)
    assert _params(ngram_worker.NGRAMWorker.__init__)[1:] == [
        "server_args",
        "gpu_id",
        "nccl_port",
        "target_worker",
    ]


def test_the_workers_hooks_and_the_corpus_interface_are_what_the_adapter_replaces() -> None:
    from sglang.srt.speculative.cpp_ngram.ngram_corpus import NgramCorpus

    for name, params in {
        "batch_get": ["self", "req_ids", "batch_tokens", "total_lens"],
        "batch_put": ["self", "batch_tokens"],
        "synchronize": ["self"],
        "reset": ["self"],
        "erase_match_state": ["self", "req_ids"],
    }.items():
        assert _params(getattr(NgramCorpus, name)) == params, f"NgramCorpus.{name} changed"
        assert callable(getattr(TreeCacheCorpus, name))
    for hook in ("_prepare_draft_tokens", "clear_cache_pool", "add_external_corpus"):
        assert hook in vars(ngram_worker.NGRAMWorker), f"NGRAMWorker.{hook} is gone: the plugin overrides it"
    source = inspect.getsource(ngram_worker.NGRAMWorker)
    for used in ("self.ngram_corpus.batch_get(", "origin_input_ids_unpadded", "self.ngram_corpus.reset()"):
        assert used in source, f"NGRAMWorker no longer uses {used}"


def test_the_real_draft_preparation_runs_on_the_tree_cache_corpus() -> None:
    """NGRAMWorker._prepare_draft_tokens (SGLang's code, sync mode) with the plugin's corpus."""
    from srt_agent.tree_cache import TreeCache

    worker_class = _srt().create_worker(SimpleNamespace(disable_overlap_schedule=True))
    worker = object.__new__(worker_class)  # SGLang's __init__ needs a GPU model runner
    worker.enable_overlap, worker.max_trie_depth, worker.draft_token_num = False, 18, D
    worker.ngram_corpus = TreeCacheCorpus(TreeCache(), D, vocab_size=100)
    prompt = [5, 6, 7]

    def req(rid: str, out: list[int]) -> Any:
        return SimpleNamespace(rid=rid, origin_input_ids_unpadded=prompt, output_ids=out, priority=None)

    batch = SimpleNamespace(reqs=[req("a", [8])], grammar_needs_sync=lambda: False)
    for t in (9, 10, 11):
        worker._prepare_draft_tokens(batch)
        batch.reqs[0].output_ids.append(t)
    batch.reqs.append(req("b", [8]))  # a second sample of the group joins while a still runs
    tokens, mask = worker._prepare_draft_tokens(batch)
    tokens, mask = tokens[D:], mask[D * D :]  # b's row
    assert tokens.shape == (D,) and mask.shape == (D * D,) and tokens[0] == 8
    assert [int(t) for t in tokens[1:] if t in (9, 10, 11)] == [9, 10, 11]
    assert np.all(mask.reshape(D, D)[:, 0] == 1)


def test_the_sampling_kernel_still_applies_the_modelled_rule() -> None:
    root = Path(importlib.import_module("sglang").__file__).parent
    kernel = (root / "kernels/jit/include/sgl_kernel/speculative/sampling.cuh").read_text()
    for line in (
        "prob_acc += target_prob_single;",
        "coin < prob_acc / threshold_acc || target_prob_single >= threshold_single",
        "draft_probs[cur_prob_offset + draft_token_id] = target_probs[cur_prob_offset + draft_token_id];",
        "coin = uniform_samples_for_final_sampling[bx];",
    ):
        assert line in kernel, (
            f"tree_speculative_sampling_target_only changed: {line!r} is gone; recheck rule.py"
        )

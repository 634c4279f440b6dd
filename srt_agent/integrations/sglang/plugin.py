"""The ``SRT`` speculative algorithm for SGLang, registered through SGLang's plugin entry point.

SGLang (``sglang==0.5.23``) loads every ``sglang.srt.plugins`` entry point in each of its
processes (launcher, scheduler, detokenizer) and calls it with no arguments; srt-agent's entry
point is :func:`register`, which registers the algorithm ``SRT``
(``--speculative-algorithm SRT``). It reuses SGLang's n-gram path end to end (tree attention,
``eagle_sample``'s verification, KV bookkeeping, the overlap scheduler), and changes only where
drafts come from and what survives a flush:

* ``SRTWorker`` is SGLang's ``NGRAMWorker`` with :class:`~.corpus.TreeCacheCorpus` as its corpus:
  drafts from srt-agent's tree cache keyed by the request's prompt (the conversation state), in
  SGLang's layout with distinct siblings and pads (exact under SGLang's kernel, see :mod:`.rule`);
* a weight update or ``/flush_cache`` clears SGLang's KV cache and the requests' match state, not
  the trees: earlier RL steps keep drafting (verification keeps the sampled distribution exact);
* ``SRTAlgorithm`` is SGLang's ``CustomSpecAlgo`` completed with what its scheduler asks of a
  built-in algorithm (``is_ngram``, ``create_future_map``, ...) and with the n-gram server-arg
  defaults, plus the acceptance thresholds at 1.0 (any lower value would bias sampling).

The options come from the environment, since SGLang's argument parser is not extensible:
``SRT_SPEC_CONFIG`` names an options file (``srt-agent sglang-serve --config`` sets it): a run
config, its ``spec`` section alone, or its ``spec.cache`` section alone, as YAML or JSON.
``spec.cache`` configures the tree cache, ``spec.max_draft_tokens + 1`` is the default of
``--speculative-num-draft-tokens``, and ``SRT_CACHE_BYTES`` overrides the byte budget. At startup
(:func:`validate_server_args`, also when SGLang is launched directly) options the worker cannot
honour are refused with the reason: see :func:`srt_agent.integrations.sglang.refusals.sglang_refusals` and
:func:`srt_agent.config.spec_file.load_spec` (``server``).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from srt_agent.config.sections import SpecSection
    from srt_agent.tree_cache import TreeCacheConfig

log = logging.getLogger(__name__)

ALGORITHM = "SRT"
"""The name to pass as ``--speculative-algorithm``."""

SPEC_FILE_VARIABLE = "SRT_SPEC_CONFIG"
"""The environment variable naming the options file the SRT worker reads its ``spec`` from."""

CACHE_BYTES_VARIABLE = "SRT_CACHE_BYTES"
"""The environment variable overriding the tree cache's byte budget (``spec.cache.byte_budget``)."""


EXACT_THRESHOLDS = {"speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0}
"""Below 1.0 SGLang's kernel accepts drafts the target would not sample: SRT refuses that."""


def register() -> None:
    """SGLang's plugin entry point: register ``SRT`` once per process (a no-op without SGLang).

    SGLang logs and swallows a plugin's exceptions, so problems are logged here too, loudly.
    """
    try:
        from sglang.srt.speculative import spec_registry
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except ImportError as exc:
        log.warning("srt-agent's SGLang plugin is installed, but SGLang cannot be imported: %s", exc)
        return
    if spec_registry.get_spec(ALGORITHM) is not None:
        return
    algorithm_class = _algorithm_class(spec_registry.CustomSpecAlgo)
    SpeculativeAlgorithm.register(
        ALGORITHM,
        supports_overlap=True,
        validate_server_args=validate_server_args,
        spec_class=algorithm_class,
    )(_worker_factory)
    log.info("srt-agent registered the %s speculative algorithm", ALGORITHM)


def validate_server_args(server_args: Any) -> None:
    """Refuse acceptance thresholds that break exactness, and options the worker cannot honour.

    Raises:
        ValueError: A threshold other than 1.0 (the message names the flag), or options of
            ``SRT_SPEC_CONFIG`` SGLang has no counterpart for, or a
            ``--speculative-num-draft-tokens`` that contradicts its ``spec.max_draft_tokens``.
        ConfigError: ``SRT_SPEC_CONFIG`` or ``SRT_CACHE_BYTES`` is invalid.
    """
    from srt_agent.integrations.sglang.refusals import sglang_refusals

    for name, exact in EXACT_THRESHOLDS.items():
        value = getattr(server_args, name, exact)
        if value is not None and value != exact:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {value}: SRT keeps sampling exact only at {exact}; leave it at {exact}")
    path = os.environ.get(SPEC_FILE_VARIABLE)
    slots = getattr(server_args, "speculative_num_draft_tokens", None) if path else None
    refused = sglang_refusals(worker_spec(), slots)
    if refused:
        raise ValueError(f"{SPEC_FILE_VARIABLE}={path}: " + "; ".join(refused))


def ngram_defaults(server_args: Any, draft_slots: int | None = None) -> None:
    """Apply the server-arg defaults SGLang gives its own n-gram algorithm (``_handle_ngram``).

    A registered algorithm does not get them by itself: ``draft_slots`` draft slots (default:
    :func:`~srt_agent.integrations.sglang.refusals.sglang_draft_slots`), 48 running requests, no mixed
    chunked prefill, and no overlap scheduling on CPU.
    """
    if getattr(server_args, "device", None) == "cpu":
        server_args.disable_overlap_schedule = True
    if getattr(server_args, "max_running_requests", None) is None:
        server_args.max_running_requests = 48
    server_args.enable_mixed_chunk = False
    server_args.speculative_eagle_topk = server_args.speculative_ngram_max_bfs_breadth
    if getattr(server_args, "speculative_num_draft_tokens", None) is None:
        from srt_agent.integrations.sglang.refusals import sglang_draft_slots

        server_args.speculative_num_draft_tokens = draft_slots or sglang_draft_slots(None)
    if getattr(server_args, "speculative_num_steps", None) is None:
        server_args.speculative_num_steps = (
            server_args.speculative_num_draft_tokens // server_args.speculative_eagle_topk
        )


def _worker_factory(server_args: Any) -> type:
    """SGLang's worker factory for ``SRT``: the n-gram worker drafting from the tree cache."""
    from sglang.srt.speculative.ngram_worker import NGRAMWorker

    return _worker_class(NGRAMWorker)


def _algorithm_class(base: type) -> type:
    """``CustomSpecAlgo`` with what SGLang's scheduler calls on its built-in algorithms."""

    class SRTAlgorithm(base):  # type: ignore[misc]
        """SGLang's algorithm object for ``SRT``: the n-gram path, drafts from the tree cache."""

        def is_ngram(self) -> bool:
            return True  # the n-gram verify path, overlap relay and CUDA-graph inputs

        def has_draft_kv(self) -> bool:
            return False  # no draft model, no draft KV cache

        def carries_draft_hidden_states(self) -> bool:
            return False

        def need_topk(self) -> bool:
            return False

        def get_platform_worker_cls(self) -> type | None:
            return None  # SRT's worker is its own on every platform

        def handle_server_args(self, server_args: Any) -> None:
            given = os.environ.get(SPEC_FILE_VARIABLE)  # without a file, SGLang's n-gram default
            from srt_agent.integrations.sglang.refusals import sglang_draft_slots

            ngram_defaults(server_args, sglang_draft_slots(worker_spec() if given else None))

        def create_future_map(
            self,
            device: Any,
            req_to_token_pool: Any,
            needs_cpu_seq_lens: bool = True,
            needs_confidence_relay: bool = False,
        ) -> Any:
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    return SRTAlgorithm


def worker_spec(environ: Mapping[str, str] | None = None) -> SpecSection:
    """The SRT worker's options, read from the environment.

    The ``spec`` section of the options file ``SRT_SPEC_CONFIG`` names (a run config, a ``spec``
    section, or a ``spec.cache`` section; the defaults without one), with ``SRT_CACHE_BYTES``
    overriding ``spec.cache.byte_budget``.

    Args:
        environ: The environment to read (default: this process's).

    Raises:
        ConfigError: The file is missing or invalid, ``SRT_CACHE_BYTES`` is not a byte count, or
            a bare ``spec`` section turns run-ahead on (the message names the key and the fix;
            SGLang then fails to start).
    """
    from srt_agent.config.spec_file import load_spec

    env = os.environ if environ is None else environ
    budget = env.get(CACHE_BYTES_VARIABLE)
    overrides = [f"spec.cache.byte_budget={budget}"] if budget else []
    return load_spec(env.get(SPEC_FILE_VARIABLE) or None, overrides, server=True)


def worker_cache_config(environ: Mapping[str, str] | None = None) -> TreeCacheConfig:
    """The SRT worker's tree cache settings: ``worker_spec(environ).cache``."""
    return worker_spec(environ).cache


def _worker_class(base: type) -> type:
    """``NGRAMWorker`` with the tree cache as its corpus and trees kept across flushes."""
    from srt_agent.integrations.sglang.corpus import TreeCacheCorpus
    from srt_agent.tree_cache import TreeCache

    class SRTWorker(base):  # type: ignore[misc]
        """SGLang's n-gram worker drafting from srt-agent's tree cache."""

        def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
            config = worker_cache_config()
            vocab = int(self.model_runner.model_config.vocab_size)
            self.ngram_corpus = TreeCacheCorpus(TreeCache(config), self.draft_token_num, vocab)

        def _prepare_draft_tokens(self, batch: Any) -> Any:
            corpus = self.ngram_corpus
            for req in batch.reqs:  # every decode step: hash a prompt only on its request's first
                if not corpus.knows(req.rid):
                    runahead = (getattr(req, "priority", None) or 0) < 0
                    corpus.bind(req.rid, req.origin_input_ids_unpadded, "runahead" if runahead else "live")
            return super()._prepare_draft_tokens(batch)

        def clear_cache_pool(self) -> None:
            # A flush (weight update, /flush_cache) invalidates KV, not what was generated.
            self.ngram_corpus.forget_requests()
            self._prev_decode_rids: set[str] = set()

        def add_external_corpus(self, corpus_id: str, token_chunks: list[list[int]]) -> int:
            raise ValueError(
                "SRT drafts from its tree cache; external n-gram corpora need --speculative-algorithm NGRAM"
            )

    return SRTWorker

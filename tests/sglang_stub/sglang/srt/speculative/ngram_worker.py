"""Stand-in of sglang/srt/speculative/ngram_worker.py (0.5.23), sync (non-overlap) mode.

It keeps what the SRT plugin relies on: the constructor's signature and attributes, the
corpus calls of ``_prepare_draft_tokens`` (the last ``max_trie_depth`` context tokens, the
context length, ``batch_get``, the size check) and ``clear_cache_pool``.
"""


class _TrieStandIn:
    """What NGRAMWorker builds by default (the C++ trie); the plugin replaces it."""

    def reset(self):
        self.was_reset = True


class NGRAMWorker:
    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        self.server_args = server_args
        self.enable_overlap = False
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.draft_token_num = server_args.speculative_num_draft_tokens
        self.max_trie_depth = server_args.speculative_ngram_max_trie_depth
        self._prev_decode_rids = set()
        self.ngram_corpus = _TrieStandIn()

    def clear_cache_pool(self):
        self.ngram_corpus.reset()
        self._prev_decode_rids = set()

    def _efficient_concat_last_n(self, seq1, seq2, n):
        if len(seq2) >= n:
            return seq2[-n:]
        return seq1[-(n - len(seq2)) :] + seq2

    def _prepare_draft_tokens(self, batch):
        req_ids = [req.rid for req in batch.reqs]
        self.ngram_corpus.synchronize()
        batch_tokens, total_lens = [], []
        for req in batch.reqs:
            batch_tokens.append(
                self._efficient_concat_last_n(
                    list(req.origin_input_ids_unpadded[-self.max_trie_depth :]),
                    list(req.output_ids[-self.max_trie_depth :]),
                    self.max_trie_depth,
                )
            )
            total_lens.append(len(req.origin_input_ids_unpadded) + len(req.output_ids))
        req_drafts, mask = self.ngram_corpus.batch_get(req_ids, batch_tokens, total_lens)
        assert len(req_drafts) == len(batch.reqs) * self.draft_token_num
        return req_drafts, mask

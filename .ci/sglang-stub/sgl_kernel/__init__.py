"""Minimal stand-in for the compiled `sgl_kernel` (sglang-kernel 0.4.10) package.

Defines only the names sglang 0.5.23 imports at module-import time on this path
(the *_cpu names are imported only when SGLANG_USE_CPU_ENGINE=1).  Every function
raises NotImplementedError when called.  `scalar_type` is deliberately absent:
sglang.srt.layers.quantization.utils falls back to a mock on ImportError.
"""

__version__ = "0.4.10"


def _unavailable(name):
    def _f(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel stub: {name} is not available (no compiled sgl_kernel)")

    _f.__name__ = name.rsplit(".", 1)[-1]
    _f.__qualname__ = _f.__name__
    return _f


# kernels/ops/speculative/cache_locs.py, spec_tree.py, ... (CPU-engine branch)
assign_draft_cache_locs_contiguous_cpu = _unavailable("sgl_kernel.assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _unavailable("sgl_kernel.assign_extend_cache_locs_cpu")
copy_all_layer_kv_cache_cpu = _unavailable("sgl_kernel.copy_all_layer_kv_cache_cpu")
assign_req_to_token_pool_cpu = _unavailable("sgl_kernel.assign_req_to_token_pool_cpu")
build_tree_kernel_efficient_cpu = _unavailable("sgl_kernel.build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _unavailable("sgl_kernel.verify_tree_greedy_cpu")
fill_accept_out_cache_loc_cpu = _unavailable("sgl_kernel.fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _unavailable("sgl_kernel.fill_bonus_tokens_cpu")

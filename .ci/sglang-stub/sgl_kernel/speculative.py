"""Stub of sgl_kernel.speculative (imported by sglang/kernels/ops/speculative/reconstruct_tree.py)."""

from sgl_kernel import _unavailable

reconstruct_indices_from_tree_mask = _unavailable("sgl_kernel.speculative.reconstruct_indices_from_tree_mask")

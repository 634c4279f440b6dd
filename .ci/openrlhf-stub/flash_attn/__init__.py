"""CI stand-in for flash-attn (a CUDA extension), so OpenRLHF's model module imports on a CPU.

OpenRLHF imports flash-attn's padding helpers at module level but calls them only when packing
samples (``--ds.packing_samples``, a GPU path): the openrlhf tier runs its unpacked path, and any
call into these helpers fails with a message saying so.
"""

"""Key/value cache with one row per running sequence, plus the attention biases that read it.

Layout: one tensor ``(layers, 2, rows, kv_heads, seq, head_dim)`` (2 = keys, values). Rows are the
batch dimension of a forward pass: the running sequences occupy rows ``0 .. n-1`` contiguously (the
scheduler moves the last row into a freed one), so a forward over rows ``[a, b)`` attends to the
view ``cache[l, :, a:b, :, :L]`` without gathering. Capacity grows by doubling in rows and positions
(amortised, never per token); new memory is zero-filled because masked positions are still
multiplied by 0 inside attention, and uninitialised memory could hold NaN (``0 * NaN = NaN``).

A forward writes its new tokens at explicit positions, so a token tree can be written at positions
``prefix .. prefix + n - 1`` in tree order and, after verification, :meth:`KVCache.keep` compacts the
accepted entries to be contiguous: the rejected ones are simply overwritten later.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch


class KVCache:
    """Preallocated, growable key/value storage for the rows of a running batch.

    Args:
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Width of one head.
        max_rows: Most rows (concurrent sequences) it may grow to.
        max_positions: Most positions per row it may grow to.
        dtype: Storage dtype (the model's).
        device: Storage device.
        initial_rows: Rows allocated up front.
        initial_positions: Positions allocated up front.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_rows: int,
        max_positions: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        initial_rows: int = 1,
        initial_positions: int = 256,
    ) -> None:
        self.max_rows = max_rows
        self.max_positions = max_positions
        rows, positions = min(initial_rows, max_rows), min(initial_positions, max_positions)
        # (layers, 2, rows, Hkv, S, D)
        self.data = torch.zeros(
            (num_layers, 2, rows, num_kv_heads, positions, head_dim), dtype=dtype, device=device
        )

    @property
    def rows(self) -> int:
        """Rows allocated now."""
        return self.data.shape[2]

    @property
    def positions(self) -> int:
        """Positions per row allocated now."""
        return self.data.shape[4]

    def reserve(self, rows: int, positions: int) -> None:
        """Grow (by doubling, up to the maxima) so that ``rows`` rows of ``positions`` fit.

        Args:
            rows: Rows needed.
            positions: Positions per row needed.

        Raises:
            ValueError: More than ``max_rows`` / ``max_positions`` requested.
        """
        if rows > self.max_rows or positions > self.max_positions:
            raise ValueError(
                f"KV cache request of {rows} rows x {positions} positions exceeds its maximum "
                f"{self.max_rows} x {self.max_positions}"
            )
        if rows <= self.rows and positions <= self.positions:
            return
        new_rows, new_pos = self.rows, self.positions
        while new_rows < rows:
            new_rows = min(2 * new_rows, self.max_rows)
        while new_pos < positions:
            new_pos = min(2 * new_pos, self.max_positions)
        shape = list(self.data.shape)
        shape[2], shape[4] = new_rows, new_pos
        grown = torch.zeros(shape, dtype=self.data.dtype, device=self.data.device)
        grown[:, :, : self.rows, :, : self.positions] = self.data
        self.data = grown

    def write_index(self, row_start: int | torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat indices (into :meth:`write`'s view) of new tokens' keys and values, for every layer.

        Computed once per forward, so each layer's write is a single ``index_copy_``.

        Args:
            row_start: First row of the forward's contiguous row range, or a ``(B,)`` int64
                tensor of the rows themselves (on the device: a CUDA graph can take it as input).
            positions: ``(B, T)`` int64 cache positions to write (within capacity, distinct).

        Returns:
            ``(B * T * 2 * Hkv,)`` int64, ordered like ``kv`` of :meth:`write`.
        """
        _, _, rows_cap, hkv, seq_cap, _ = self.data.shape
        device = positions.device
        rows = (
            torch.arange(row_start, row_start + positions.shape[0], device=device)
            if isinstance(row_start, int)
            else row_start
        )
        kind = torch.arange(2, device=device)  # 0 = key, 1 = value
        heads = torch.arange(hkv, device=device)
        # Row-major offset of (kind, row, head, position) in the (2, R, Hkv, S) leading dims.
        base = (kind[None, :, None] * rows_cap + rows[:, None, None]) * hkv + heads[
            None, None, :
        ]  # (B, 2, Hkv)
        index = base[:, None] * seq_cap + positions[:, :, None, None]  # (B, T, 2, Hkv)
        return index.reshape(-1)

    def write(self, layer: int, index: torch.Tensor, kv: torch.Tensor) -> None:
        """Store keys and values of new tokens (one ``index_copy_``).

        Args:
            layer: Decoder layer.
            index: From :meth:`write_index`.
            kv: ``(B * T, 2, Hkv, D)`` keys (index 0 of dim 1) and values (index 1).
        """
        flat = self.data[layer].view(-1, self.data.shape[-1])  # (2 * R * Hkv * S, D)
        flat.index_copy_(0, index, kv.reshape(-1, kv.shape[-1]))

    def read(
        self, layer: int, row_start: int | torch.Tensor, num_rows: int, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``0 .. length-1`` of a row range, as views (no copy).

        Args:
            layer: Decoder layer.
            row_start: First row, or a ``(B,)`` int64 tensor of rows (then gathered: a copy).
            num_rows: Number of rows.
            length: Positions to read.

        Returns:
            ``(keys, values)``, each ``(B, Hkv, length, D)``.
        """
        if isinstance(row_start, int):
            kv = self.data[layer, :, row_start : row_start + num_rows, :, :length]
        else:
            kv = self.data[layer][:, row_start, :, :length]  # (2, B, Hkv, length, D)
        return kv[0], kv[1]

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``src`` into row ``dst`` (all layers).

        Args:
            src: Source row.
            dst: Destination row.
            length: Positions to copy.
        """
        if src != dst and length > 0:
            self.data[:, :, dst, :, :length] = self.data[:, :, src, :, :length]

    def keep(self, row: int, start: int, offsets: Sequence[int]) -> None:
        """Keep a subset of the entries written at ``start ..`` and make them contiguous.

        After a tree forward wrote node ``j`` at position ``start + j``, keeping the accepted path
        ``offsets = [j0, j1, ...]`` moves node ``j_i`` to position ``start + i`` (all layers). The
        positions after ``start + len(offsets)`` are stale and must be treated as free by the caller.

        Args:
            row: Cache row.
            start: First newly written position (the sequence's length before the forward).
            offsets: Indices of kept entries relative to ``start``, increasing.

        Raises:
            ValueError: ``offsets`` are not strictly increasing non-negative indices.
        """
        self.keep_many([(row, start, offsets)])

    def keep_many(self, keeps: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        """:meth:`keep` for several rows at once: one gather and one scatter for the whole step.

        Args:
            keeps: ``(row, start, offsets)`` per row, as :meth:`keep` takes them (distinct rows).

        Raises:
            ValueError: Some ``offsets`` are not strictly increasing non-negative indices.
        """
        rows: list[int] = []
        dst: list[int] = []
        src: list[int] = []
        for row, start, offsets in keeps:
            if any(b <= a for a, b in itertools.pairwise(offsets)) or (offsets and offsets[0] < 0):
                raise ValueError(f"kept offsets must be strictly increasing and >= 0, got {list(offsets)}")
            for i, o in enumerate(offsets):
                if o != i:  # entries already in place need no copy
                    rows.append(row)
                    dst.append(start + i)
                    src.append(start + o)
        if not rows:
            return
        index = torch.tensor([rows, dst, src], dtype=torch.long).to(self.data.device, non_blocking=True)
        r, d, s = index[0], index[1], index[2]
        # The right side is gathered (copied) before the scatter, so overlapping entries are safe.
        self.data[:, :, r, :, d] = self.data[:, :, r, :, s]


def decode_bias(lengths: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Attention bias of a one-token decode step: each row sees its first ``lengths[b]`` positions.

    Args:
        lengths: ``(B,)`` int64: positions valid for each row, the new token's included.
        length: Columns ``L`` (the longest row).
        dtype: Bias dtype (the model's).

    Returns:
        ``(B, 1, 1, L)``: 0 where attended, -inf elsewhere.
    """
    cols = torch.arange(length, device=lengths.device)
    bias = torch.zeros((lengths.shape[0], 1, 1, length), dtype=dtype, device=lengths.device)
    return bias.masked_fill_((cols[None, :] >= lengths[:, None])[:, None, None, :], float("-inf"))


def causal_bias(
    prefix_lengths: Sequence[int],
    num_new: int,
    length: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Attention bias of ``num_new`` causal new tokens per row after per-row cached prefixes.

    Row ``b``'s token ``t`` (written at ``prefix[b] + t``) sees positions ``0 .. prefix[b] + t``.
    Padding tokens past a row's real ones follow the same rule, so they never see an empty set
    (which would make NaN) and their outputs are simply ignored.

    Args:
        prefix_lengths: Cached positions per row before the new tokens.
        num_new: ``T``, new tokens per row (padded).
        length: Columns ``L``.
        dtype: Bias dtype.
        device: Where to build it (on a GPU the bias is made there: only the prefix lengths travel).

    Returns:
        ``(B, 1, T, L)`` bias.
    """
    prefix = torch.tensor(list(prefix_lengths), dtype=torch.long).to(device)
    cols = torch.arange(length, device=device)
    last = prefix[:, None] + torch.arange(num_new, device=device)[None, :]  # (B, T): last visible column
    blocked = cols[None, None, :] > last[:, :, None]  # (B, T, L)
    bias = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, float("-inf"))
    return bias[:, None]


def mask_bias(prefix: torch.Tensor, masks: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
    """Attention bias of token trees given as ancestor bitmasks, built on the tensors' device.

    The device-side twin of :func:`tree_bias` (same rule, same padding convention): node ``t`` of
    row ``b`` sits at cache position ``prefix[b] + t`` and sees the prefix and the tree positions
    whose bits are set in ``masks[b, t]`` (itself and its ancestors). A plain decode step is the
    tree of one node (mask 1). It makes no host sync, so it can run inside a CUDA graph.

    Args:
        prefix: ``(B,)`` int64 cached positions per row.
        masks: ``(B, T)`` int64 ancestor bitmasks (bit ``j``: tree position ``j``), ``T <= 62``.
        length: Columns ``L`` (at least ``max(prefix) + T``).
        dtype: Bias dtype.

    Returns:
        ``(B, 1, T, L)``: 0 where attended, -inf elsewhere.
    """
    num_new = masks.shape[1]
    rel = torch.arange(length, device=prefix.device)[None, :] - prefix[:, None]  # (B, L)
    bit = rel.clamp(0, num_new - 1)
    sees = torch.bitwise_and(torch.bitwise_right_shift(masks[:, :, None], bit[:, None, :]), 1)  # (B, T, L)
    in_tree = ((rel >= 0) & (rel < num_new))[:, None, :]
    visible = (rel < 0)[:, None, :] | ((sees != 0) & in_tree)
    bias = torch.zeros(visible.shape, dtype=dtype, device=prefix.device)
    return bias.masked_fill_(~visible, float("-inf"))[:, None]


def tree_bias(
    prefix_lengths: Sequence[int], parents: Sequence[Sequence[int]], length: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention bias and position ids of token trees appended to per-row cached prefixes.

    Node ``j`` of row ``b`` is written at cache position ``prefix[b] + j`` and sees the prefix plus
    its ancestors and itself; its RoPE position is ``prefix[b] + depth(j)``. Rows with fewer nodes
    are padded with chain nodes (each the child of the previous) whose outputs are to be ignored.

    Args:
        prefix_lengths: Cached positions per row.
        parents: Per row, the parent index of each node (``-1`` for a child of the prefix); a
            parent must precede its child.
        length: Columns ``L`` (at least ``max(prefix) + T``).
        dtype: Bias dtype.

    Returns:
        ``(bias (B, 1, T, L), positions (B, T) int64)``.

    Raises:
        ValueError: A parent index does not precede its node.
    """
    num_new = max((len(p) for p in parents), default=0)
    batch = len(parents)
    # Per row, in plain Python (trees are a few nodes): each node's depth and the bitmask of the
    # nodes it sees (itself and its ancestors). Parents precede their nodes, so one pass suffices.
    # Padding continues the row as a chain of its last node.
    depths: list[list[int]] = []
    masks: list[list[int]] = []
    for b, row in enumerate(parents):
        mask: list[int] = []
        depth: list[int] = []
        for j in range(num_new):
            up = row[j] if j < len(row) else j - 1
            if not -1 <= up < j:
                raise ValueError(f"row {b}: node {j} has parent {up}; parents must precede their nodes")
            mask.append((mask[up] if up >= 0 else 0) | (1 << j))
            depth.append(depth[up] + 1 if up >= 0 else 0)
        depths.append(depth)
        masks.append(mask)
    prefix = torch.tensor(list(prefix_lengths), dtype=torch.long)
    # Column c of row b is visible to all its nodes before the tree block (rel < 0); inside the
    # block (0 <= rel < T) to node t if node rel is t's ancestor or t itself; never after it.
    rel = torch.arange(length)[None, :] - prefix[:, None]  # (B, L)
    bit = rel.clamp(0, max(num_new - 1, 0))[:, None, :]  # (B, 1, L)
    if num_new <= 62:  # the masks fit int64: read the bits with one shift
        sees = (torch.tensor(masks, dtype=torch.long).view(batch, num_new, 1) >> bit) & 1  # (B, T, L)
    else:
        table = [[[bool(m >> k & 1) for k in range(num_new)] for m in row] for row in masks]
        sees = torch.tensor(table, dtype=torch.bool).gather(2, bit.expand(batch, num_new, length))
    in_tree = ((rel >= 0) & (rel < num_new))[:, None, :]
    visible = (rel < 0)[:, None, :] | (sees.bool() & in_tree)  # (B, T, L)
    bias = torch.zeros(visible.shape, dtype=dtype).masked_fill_(~visible, float("-inf"))
    depth_t = torch.tensor(depths, dtype=torch.long).view(batch, num_new)
    return bias[:, None], prefix[:, None] + depth_t

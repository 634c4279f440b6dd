"""Weight-sync process groups built the way SGLang builds them, and the learner's side of a sync.

SGLang (0.5.23) receives weights broadcast by a learner over a torch process group that is *not*
the default one: ``/init_weights_update_group`` makes each server rank join a group of
``world_size`` ranks through a ``tcp://host:port`` rendezvous whose store (a ``TCPStore``) the
learner's rank 0 hosts, under a ``PrefixStore`` named after the group.
:func:`init_custom_process_group` builds that group with torch's c10d API, so a learner that calls
it with ``rank=0`` and the server ranks (SGLang's, or ``srt-agent serve``'s, which use this
function) meet in one group: the rendezvous keys, the store prefix and the backend's own keys are
the same on both sides (given the same torch version). A vLLM ``StatelessProcessGroup`` / PyNccl
communicator or a ``ray.util.collective`` group cannot join it.

Then ``/update_weights_from_distributed`` names the tensors (``names``, ``dtypes``, ``shapes``) and
the server receives each by ``torch.distributed.broadcast(t, src=0, group=pg)`` in list order, or,
with ``load_format="flattened_bucket"``, one ``uint8`` buffer holding their bytes back to back.
:class:`WeightSender` is the learner's side: it sends named tensors in that order, and gives the
request body that describes them. The receiver's side is :func:`receive_tensors`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist

from srt_agent.serving.bodies import DEFAULT_GROUP_NAME, UpdateFromDistributedBody

__all__ = [
    "FLATTENED_BUCKET",
    "WeightSender",
    "dtype_from_name",
    "dtype_name",
    "init_custom_process_group",
    "receive_tensors",
    "tcp_init_method",
    "update_request",
]


FLATTENED_BUCKET = "flattened_bucket"
"""The ``load_format`` whose tensors travel as one ``uint8`` buffer (SGLang's ``FlattenedTensorBucket``)."""

DEFAULT_TIMEOUT = timedelta(minutes=30)
"""torch's ``default_pg_timeout``, which SGLang uses: how long a rendezvous or a collective waits."""


def tcp_init_method(host: str, port: int) -> str:
    """``tcp://host:port`` (an IPv6 host in brackets), the ``init_method`` SGLang makes of an address."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def init_custom_process_group(
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> dist.ProcessGroup:
    """Join (or, as ``rank`` 0, host) a process group apart from the default one, as SGLang does.

    The rendezvous on ``init_method`` gives a store (``tcp://``: a ``TCPStore`` that rank 0
    serves and the others connect to, retrying until ``timeout``); the group's keys go under a
    ``PrefixStore(group_name, store)``, and torch's ``_new_process_group_helper`` makes the group
    over it. It returns once every rank has joined (or raises after ``timeout``). No default
    process group is needed, and the group's ranks are its own (``src=0`` in a broadcast is the
    learner's rank 0).

    Args:
        backend: ``"nccl"`` (tensors on CUDA) or ``"gloo"`` (CPU).
        init_method: Where to meet, e.g. ``tcp://10.0.0.1:29600`` (:func:`tcp_init_method`).
        world_size: Ranks in the group (the learner's rank 0 plus every server rank).
        rank: This process's rank in it (a server's is its ``rank_offset`` plus its TP rank).
        group_name: The group's name: the store prefix, identical on every rank. A process can be
            in only one group of a name at a time.
        timeout: How long the rendezvous and each collective may wait.

    Raises:
        ValueError: A bad argument, or a group of that name exists in this process.
        RuntimeError: The rendezvous or the backend failed (torch's error, e.g. a timeout).
    """
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.rendezvous import rendezvous

    if not group_name:
        raise ValueError("group_name must not be empty")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    if group_name in c10d._world.pg_names.values():
        raise ValueError(f"this process is already in a process group named {group_name!r}")
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    # torch 2.6 renamed pg_options to backend_options; neither is set.
    params = inspect.signature(c10d._new_process_group_helper).parameters
    options = {"backend_options": None} if "backend_options" in params else {"pg_options": None}
    pg, _ = c10d._new_process_group_helper(
        world_size,
        rank,
        [],
        dist.Backend(backend),
        store,
        group_name=cast(Any, group_name),  # a GroupName (a str) in recent torch
        timeout=timeout,
        device_id=None,
        **options,
    )
    # A broadcast's src is mapped through this table: the group's ranks are the global ones.
    c10d._world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return cast(dist.ProcessGroup, pg)


def dtype_name(dtype: torch.dtype) -> str:
    """The ``dtypes`` entry SGLang reads for ``dtype``: ``"bfloat16"``, not ``"torch.bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype a ``dtypes`` entry names (``"float32"``; a ``"torch."`` prefix is dropped).

    Raises:
        ValueError: Not the name of a torch dtype.
    """
    found = getattr(torch, name.removeprefix("torch."), None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype (send e.g. 'bfloat16' or 'float32')")
    return found


def _bucket_layout(
    dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]
) -> tuple[list[tuple[int, int]], int]:
    """Byte ranges of tensors laid back to back in one buffer (each must start aligned to its dtype)."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes, strict=True)):
        if offset % dtype.itemsize:
            raise ValueError(
                f"tensor {i} ({dtype}) would start at byte {offset} of the bucket, not a multiple of its "
                f"item size {dtype.itemsize}: order the tensors so that each starts aligned"
            )
        size = math.prod(shape) * dtype.itemsize
        ranges.append((offset, offset + size))
        offset += size
    if not ranges:
        raise ValueError("a flattened bucket needs at least one tensor")
    return ranges, offset


def receive_tensors(
    group: dist.ProcessGroup,
    names: Sequence[str],
    dtypes: Sequence[str | torch.dtype],
    shapes: Sequence[Sequence[int]],
    *,
    device: torch.device | str = "cpu",
    load_format: str | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """Receive named tensors that rank 0 of ``group`` broadcasts, as SGLang's receiver does.

    Each tensor is a ``broadcast(src=0)`` into a new tensor, all started in list order then awaited;
    with ``load_format="flattened_bucket"``, a single ``uint8`` broadcast of their bytes back to back.

    Raises:
        ValueError: The lists differ in length, a dtype is unknown, a shape is negative, or a
            bucket's tensor would start unaligned (checked before anything is received).
        RuntimeError: The broadcast failed (torch's error, e.g. a timeout).
    """
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(
            f"names, dtypes and shapes differ in length ({len(names)}, {len(dtypes)}, {len(shapes)})"
        )
    kinds = [d if isinstance(d, torch.dtype) else dtype_from_name(d) for d in dtypes]
    sizes = [tuple(int(n) for n in s) for s in shapes]
    if any(n < 0 for s in sizes for n in s):
        raise ValueError(f"shapes must not be negative, got {[list(s) for s in sizes]}")
    if load_format == FLATTENED_BUCKET:
        ranges, total = _bucket_layout(kinds, sizes)
        buffer = torch.empty(total, dtype=torch.uint8, device=device)
        dist.broadcast(buffer, src=0, group=group)
        return [
            (name, buffer[start:end].view(kind).reshape(size))
            for name, kind, size, (start, end) in zip(names, kinds, sizes, ranges, strict=True)
        ]
    if load_format not in (None, "auto", "direct"):
        raise ValueError(f"load_format {load_format!r} is not supported (use None or {FLATTENED_BUCKET!r})")
    tensors = [torch.empty(size, dtype=kind, device=device) for kind, size in zip(kinds, sizes, strict=True)]
    works = [dist.broadcast(t, src=0, group=group, async_op=True) for t in tensors]
    for work in works:
        if work is not None:
            work.wait()
    return list(zip(names, tensors, strict=True))


def update_request(
    named: Iterable[tuple[str, torch.Tensor]],
    *,
    group_name: str = DEFAULT_GROUP_NAME,
    flush_cache: bool = True,
    load_format: str | None = None,
) -> dict[str, Any]:
    """The ``/update_weights_from_distributed`` body that describes ``named`` (in its order)."""
    pairs = list(named)
    return UpdateFromDistributedBody(
        names=[name for name, _ in pairs],
        dtypes=[dtype_name(t.dtype) for _, t in pairs],
        shapes=[list(t.shape) for _, t in pairs],
        group_name=group_name,
        flush_cache=flush_cache,
        load_format=load_format,
    ).wire()


class WeightSender:
    """The learner's rank 0 of a weight-sync group: broadcasts named tensors to the servers.

    The servers must be told what to receive, in the same order, by
    ``/update_weights_from_distributed`` (:meth:`request` gives its body); the HTTP call answers
    once they have received and loaded the tensors, so fire it before :meth:`send` and await it
    after (``send`` blocks until the servers receive).

    Args:
        group: The group (from :func:`init_custom_process_group` with ``rank=0``).
        group_name: Its name, sent to the servers.
        device: Where the tensors must be to travel: a GPU for NCCL (by default the current
            one), the CPU for gloo (the default). Tensors elsewhere are copied there.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        *,
        group_name: str = DEFAULT_GROUP_NAME,
        device: torch.device | str | None = None,
    ) -> None:
        self.group = group
        self.group_name = group_name
        if device is None:
            nccl = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.device = torch.device(device)

    @classmethod
    def connect(
        cls,
        master_address: str,
        master_port: int,
        world_size: int,
        *,
        group_name: str = DEFAULT_GROUP_NAME,
        backend: str = "nccl",
        timeout: timedelta = DEFAULT_TIMEOUT,
        device: torch.device | str | None = None,
    ) -> WeightSender:
        """Host the group's store on ``master_port`` as rank 0 and wait for every server rank.

        The servers join with ``/init_weights_update_group`` (``rank_offset`` 1, 1 + tp, ...);
        fire those calls first: this returns once all ``world_size`` ranks have joined.
        """
        group = init_custom_process_group(
            backend,
            tcp_init_method(master_address, master_port),
            world_size,
            0,
            group_name,
            timeout=timeout,
        )
        return cls(group, group_name=group_name, device=device)

    def request(
        self,
        named: Iterable[tuple[str, torch.Tensor]],
        *,
        flush_cache: bool = True,
        flattened: bool = False,
    ) -> dict[str, Any]:
        """The ``/update_weights_from_distributed`` body for :meth:`send` of the same tensors."""
        return update_request(
            named,
            group_name=self.group_name,
            flush_cache=flush_cache,
            load_format=FLATTENED_BUCKET if flattened else None,
        )

    def send(self, named: Iterable[tuple[str, torch.Tensor]], *, flattened: bool = False) -> None:
        """Broadcast the tensors from rank 0, in order (one buffer of their bytes if ``flattened``).

        Raises:
            ValueError: ``flattened`` and a tensor would start unaligned in the buffer.
            RuntimeError: The broadcast failed (torch's error, e.g. a timeout).
        """
        tensors = [t.detach().to(self.device).contiguous() for _, t in named]
        if flattened:
            _bucket_layout(
                [t.dtype for t in tensors], [t.shape for t in tensors]
            )  # same check as the receiver
            buffer = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
            dist.broadcast(buffer, src=0, group=self.group)
            return
        for t in tensors:
            dist.broadcast(t, src=0, group=self.group)

    def close(self) -> None:
        """Leave the group (the servers leave theirs with ``/destroy_weights_update_group``)."""
        dist.destroy_process_group(self.group)

"""Import hook of the sglang test tier (``.ci/sglang-install``); not part of ``sgl_kernel``.

PyPI's torchvision 0.28.0 (the release paired with torch 2.13) is a CUDA build: its ``_C``
extension links CUDA libraries that the CPU torch does not ship, so it cannot load. torchvision
copes with that, except that ``torchvision/_meta_registrations.py`` registers fakes for
``torchvision::nms`` and ``torchvision::qnms`` unconditionally, which then do not exist.

On the first ``import torchvision`` this hook tries the real ``_C``; only if it fails does it
declare those two operators' schemas (no kernels), so torchvision's Python code imports.
``torchvision.ops.nms`` itself then fails when called. No torchvision file is changed.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.machinery
import os
import sys
from typing import Any

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIBRARY: list[Any] = []  # keeps the torch.library.Library alive


def _declare_missing_ops() -> None:
    import torch

    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.origin:
        return
    for extension in glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so")):
        try:
            torch.ops.load_library(extension)
        except (OSError, ImportError, RuntimeError):
            continue
        return  # the real extension loads: nothing to declare
    for name, schema in _SCHEMAS.items():
        try:
            getattr(torch.ops.torchvision, name)
        except (AttributeError, RuntimeError):
            if not _LIBRARY:
                _LIBRARY.append(torch.library.Library("torchvision", "FRAGMENT"))
            _LIBRARY[0].define(schema)


class _TorchvisionHook:
    """A meta-path finder that acts once, before torchvision's first import, and finds nothing."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == "torchvision":
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
            try:
                _declare_missing_ops()
            except (OSError, ImportError, RuntimeError) as exc:  # never break the import itself
                print(f"torchvision_cpu_ops: {exc!r}", file=sys.stderr)


if not any(type(h).__name__ == "_TorchvisionHook" for h in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionHook())

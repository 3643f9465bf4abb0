"""Loading a checkpoint straight into tensors you already hold (beyond the
reference): the engine's I/O threads read each tensor's bytes into the
memory of the matching destination tensor (a caller Destination fed with
the tensors' data pointers), with no tensor in between.

    params = dict(model.named_parameters())
    weightlift.load_into("/models/llama", params)                 # names match
    weightlift.load_into(files, params, fallback=my_loader)        # the rest by hand

See docs/python.md for vLLM's loaders (stacked q/k/v, remapped names).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from . import _engine
from ._engine import iterate
from ._files import weight_files
from ._params import default_weight_loader
from ._tensors import TORCH_TO_NAME


def _direct(t: torch.Tensor, dtype: str, shape) -> bool:
    """The engine can read straight into `t`: host memory, contiguous, same dtype and shape."""
    return (t.device.type == "cpu" and t.is_contiguous() and TORCH_TO_NAME.get(t.dtype) == dtype
            and list(t.shape) == list(shape))


def load_into(path_or_files, params: torch.nn.Module | Mapping[str, torch.Tensor],
              fallback: Callable[[str, torch.Tensor], None] | None = None, *, strategy: str = "stream",
              threads: int = 0, **engine) -> dict:
    """Loads every tensor of the checkpoint into `params` (a module: its
    named_parameters() and named_buffers(); or a name -> tensor mapping).

    A destination that is host memory, contiguous, of the checkpoint's dtype
    and shape is filled by the engine's threads directly (strategy "stream":
    N threads of large reads, O_DIRECT when the files are not cached; any
    engine strategy and option by name). Other destinations (CUDA, strided,
    another dtype) get the tensor copied in by torch (default_weight_loader).
    A checkpoint tensor with no destination goes to `fallback(name, tensor)`
    (remapping, stacking; the tensor is a zero-copy view of the file), or,
    without one, is a KeyError before anything is read.

    Returns the engine's statistics (its "log" and "plan": the plan the
    engine ran for the direct reads) plus "direct", "copied" and "fallback"
    (tensor counts). Keep `params` alive and untouched during the call."""
    files = weight_files(path_or_files)
    if isinstance(params, torch.nn.Module):
        targets = dict(params.named_parameters())
        targets.update(dict(params.named_buffers()))
    else:
        targets = dict(params)
    direct, copied, other = [], [], []
    for name, dtype, shape in _engine.list_tensors(files):
        t = targets.get(name)
        (other if t is None else direct if _direct(t, dtype, shape) else copied).append((name, dtype, shape))
    if other and fallback is None:
        names = ", ".join(repr(n) for n, _, _ in other[:5]) + (", ..." if len(other) > 5 else "")
        raise KeyError(f"{len(other)} checkpoint tensors have no destination ({names}); pass fallback= to take them")
    stats = {"tensors": 0, "bytes": 0, "seconds": 0.0}
    if direct:
        items = []
        for name, dtype, shape in direct:
            t = targets[name]
            items.append((name, t.data_ptr(), t.numel() * t.element_size(), dtype, list(shape)))
        with torch.no_grad():
            stats = _engine.load_into(files, items, strategy=strategy, threads=threads, **engine)
    if copied or other:
        with torch.no_grad():
            for name, w in iterate(files, ordered=False, strategy="lazy", order="offset", file_views=True,
                                   exclude=[n for n, _, _ in direct]):
                t = targets.get(name)
                if t is not None:
                    default_weight_loader(t, w)
                else:
                    fallback(name, w)
    return dict(stats, direct=len(direct), copied=len(copied), fallback=len(other))

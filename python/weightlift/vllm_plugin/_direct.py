"""Straight into the parameters: which checkpoint tensors the engine may read
into a model's parameter memory, and the stand-ins the model's own
load_weights() then receives for them.

A plan entry (Placement) says: checkpoint tensor N lands unchanged (same
dtype, same bytes; this TP rank's even shard of it when `shard` is set) in
`region`, a contiguous piece of a host parameter (the whole parameter, its
first rows when the vocabulary is padded, or one part of a stacked q/k/v or
gate/up parameter). The engine reads those bytes into `region` before the
model's load_weights() runs; the model then receives a PlannedTensor of the
checkpoint tensor's full shape and runs its own code on it, unchanged:

  * metadata (shape, dtype, ...) is the checkpoint tensor's;
  * narrow() / [a:b] onto the planned TP shard gives a stand-in of the shard;
  * copy_() of the stand-in into exactly `region` is a no-op (the bytes are
    there) and *confirms* the placement;
  * anything else (a transpose, a dtype change, another shard, arithmetic)
    reads the tensor from its file and runs on the real bytes: always correct,
    never fast.

After the load, every placement must be confirmed; an unconfirmed one whose
region overlaps a confirmed one fails the load (the engine may have written
bytes there the model never meant to), others are reported. Guesses are
therefore safe: a wrong plan costs a second read, never a wrong weight.

Pure torch; vLLM is only consulted through the model's attributes
(hf_to_vllm_mapper, packed_modules_mapping, each parameter's output_dim /
input_dim), so the rules are testable without vLLM.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

logger = logging.getLogger("weightlift.vllm")

# Names of the stacked shards, in the order they lie in their parameter.
_SHARD_ORDER = {"q": 0, "k": 1, "v": 2}

try:  # torch >= 2.0
    _no_subclass = torch._C.DisableTorchFunctionSubclass
except AttributeError:  # torch 1.13
    _no_subclass = torch._C.DisableTorchFunction


@dataclass
class Placement:
    """One checkpoint tensor read by the engine straight into parameter memory."""

    name: str                      # checkpoint name (as yielded to the model)
    dtype: torch.dtype
    full_shape: tuple[int, ...]    # in the file
    param_name: str
    region: torch.Tensor           # contiguous host view of the parameter
    shard: tuple[int, int, int] | None = None  # (dim, start, length) this rank keeps; None: whole
    confirmed: bool = False        # the model copied it into `region` (a no-op)
    written: bool = False          # the model wrote `region` itself (from the real bytes)
    materialized: int = 0          # times the real bytes had to be read
    whole: bool = False            # `region` is the whole parameter (its storage may be replaced: map_params)

    @property
    def nbytes(self) -> int:
        return self.region.numel() * self.region.element_size()

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return tuple(self.region.shape)


@dataclass
class Plan:
    placements: dict[str, Placement] = field(default_factory=dict)
    # Tensors read as this rank's shard only (not straight into a parameter):
    # name -> (dim, start, length). The model gets a full-shape stand-in.
    sharded: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    def shard_rules(self, names: Iterable[str]) -> list[str]:
        """The engine's shard rules ("NAME:DIM", one per tensor) for `names`."""
        rules = []
        for n in names:
            s = self.placements[n].shard if n in self.placements else self.sharded.get(n)
            if s is not None:
                rules.append(f"{n}:{s[0]}")
        return rules


# ---- planning -------------------------------------------------------------------------------------


def _stacked_index(shard_id) -> int | None:
    if isinstance(shard_id, bool):
        return None
    if isinstance(shard_id, int):
        return shard_id
    if isinstance(shard_id, str):
        return _SHARD_ORDER.get(shard_id)
    return None  # tuples, lists: leave to the model


def _mapped(model, name: str):
    """(parameter name, stacked index or None) the model's name mapping gives a
    checkpoint name; None when the mapping drops it or cannot be told."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    shard_id = None
    if mapper is not None:
        with_shard = getattr(mapper, "_map_name_with_shard", None)
        try:
            if with_shard is not None:
                r = with_shard(name)
                if r is None:
                    return None
                name, shard_id = r
            else:
                name = mapper._map_name(name)
                if name is None:
                    return None
        except Exception:  # a mapper we do not understand: no plan for this tensor
            return None
    if shard_id is not None:
        idx = _stacked_index(shard_id)
        return None if idx is None else (name, idx)
    return name, None


def _packed_target(model, name: str, params: dict):
    """packed_modules_mapping's stacked parameter for a checkpoint name
    ('...q_proj.weight' -> ('...qkv_proj.weight', 0)), for models whose
    mapper does not carry the stacking."""
    packed = getattr(model, "packed_modules_mapping", None) or {}
    for fused, parts in packed.items():
        for i, part in enumerate(parts):
            token = f".{part}."
            if token in name:
                target = name.replace(token, f".{fused}.", 1)
                if target in params:
                    return target, i
    return None


def _host_param(p: torch.Tensor, device_type: str) -> bool:
    """Memory the engine can fill: host or CUDA, strided, contiguous, allocated
    (not a meta tensor of online quantization, not empty)."""
    return (device_type in ("cpu", "cuda") and p.device.type == device_type and p.layout == torch.strided
            and p.is_contiguous() and p.numel() > 0 and p.data_ptr() != 0)


def make_plan(model: torch.nn.Module, tensors: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
              tp_rank: int = 0, tp_size: int = 1, device_type: str = "cpu") -> Plan:
    """Plans which checkpoint tensors (name, dtype, shape) go straight into
    which parameter memory, and which are read as this TP rank's shard only.

    A tensor goes straight in when the model's name mapping sends it to a
    parameter on `device_type`, contiguous, of the same dtype, and its bytes
    (or this rank's even split of them) fill a contiguous piece of it: the
    whole parameter; its first rows (a padded vocabulary, TP 1); one part of a
    stacked parameter whose parts, laid end to end in shard order, fill it
    exactly. A parameter that several checkpoint tensors name (tied weights)
    is left to the model."""
    params = dict(model.named_parameters(remove_duplicate=False))
    aliases: dict[int, list[str]] = defaultdict(list)
    for n, p in params.items():
        aliases[id(p)].append(n)
    tensors = list(tensors)
    ckpt_names = {t[0] for t in tensors}
    plan = Plan()

    # Checkpoint tensors by the parameter they map to.
    whole: dict[str, tuple] = {}
    stacked: dict[str, list] = defaultdict(list)
    targets: dict[str, list[str]] = defaultdict(list)
    for name, dtype, shape in tensors:
        m = _mapped(model, name)
        if m is None:
            continue
        pname, idx = m
        if idx is None and pname not in params:
            pk = _packed_target(model, pname, params)
            if pk is not None:
                pname, idx = pk
        if pname not in params:
            continue
        targets[pname].append(name)
        if idx is None:
            whole[name] = (pname, dtype, tuple(shape))
        else:
            stacked[pname].append((idx, name, dtype, tuple(shape)))

    def usable(pname: str) -> torch.Tensor | None:
        p = params[pname]
        # Several checkpoint tensors into one parameter (or into its tied
        # aliases): the last write wins in the model's own order; leave it to it.
        names = {n for alias in aliases[id(p)] for n in targets.get(alias, [])}
        if len(names) > 1 and pname not in stacked:
            return None
        for alias in aliases[id(p)]:
            if alias != pname and alias in ckpt_names:
                return None
        if not _host_param(p, device_type):
            return None
        return p.data

    for name, (pname, dtype, shape) in whole.items():
        data = usable(pname)
        if data is None or data.dtype != dtype:
            continue
        pshape = tuple(data.shape)
        p = params[pname]
        if pshape == shape:
            plan.placements[name] = Placement(name, dtype, shape, pname, data, whole=True)
            continue
        if len(pshape) != len(shape) or not shape:
            continue
        if tp_size == 1:
            # A padded vocabulary: the checkpoint fills the first rows.
            if getattr(p, "output_dim", None) == 0 and shape[0] < pshape[0] and shape[1:] == pshape[1:]:
                plan.placements[name] = Placement(name, dtype, shape, pname, data.narrow(0, 0, shape[0]))
            continue
        # This rank's even shard along the parameter's split dimension.
        for dim in {getattr(p, "output_dim", None), getattr(p, "input_dim", None)} - {None}:
            if (0 <= dim < len(shape) and shape[dim] == pshape[dim] * tp_size
                    and all(shape[i] == pshape[i] for i in range(len(shape)) if i != dim)):
                plan.placements[name] = Placement(name, dtype, shape, pname, data,
                                                  (dim, tp_rank * pshape[dim], pshape[dim]), whole=True)
                break

    for pname, parts in stacked.items():
        data = usable(pname)
        if data is None:
            continue
        p = params[pname]
        dim = getattr(p, "output_dim", 0)
        if dim != 0:
            continue  # only dim-0 pieces are contiguous
        parts.sort()
        if len({i for i, *_ in parts}) != len(parts):
            continue
        sizes = []
        ok = True
        for _, _name, dtype, shape in parts:
            if (dtype != data.dtype or len(shape) != data.dim() or shape[1:] != tuple(data.shape[1:])
                    or shape[0] % tp_size):
                ok = False
                break
            sizes.append(shape[0] // tp_size)
        if not ok or sum(sizes) != data.shape[0]:
            continue
        off = 0
        for (_, name, dtype, shape), size in zip(parts, sizes):
            shard = (0, tp_rank * size, size) if tp_size > 1 else None
            plan.placements[name] = Placement(name, dtype, shape, pname, data.narrow(0, off, size), shard)
            off += size

    # The rest at TP > 1: tensors the model slices evenly along a parameter's
    # split dimension are read as this rank's shard only (into new memory).
    if tp_size > 1:
        for name, (pname, _dtype, shape) in whole.items():
            if name in plan.placements:
                continue
            p = params[pname]
            pshape = tuple(p.shape)
            if len(pshape) != len(shape):
                continue
            for dim in {getattr(p, "output_dim", None), getattr(p, "input_dim", None)} - {None}:
                if (0 <= dim < len(shape) and shape[dim] == pshape[dim] * tp_size
                        and all(shape[i] == pshape[i] for i in range(len(shape)) if i != dim)):
                    plan.sharded[name] = (dim, tp_rank * pshape[dim], pshape[dim])
                    break
    return plan


def weights_transforms(model: torch.nn.Module) -> list | None:
    """vLLM 0.34's WeightsMapper.weights_transforms that the model's
    load_weights runs over the raw stream before its name mapping: those of
    its hf_to_vllm_mapper and of its quantization config's mappers (looked
    up as vLLM's AutoWeightsLoader does: the model or a direct child holding
    a quant_config). None when a mapper cannot be asked (then nothing is
    planned)."""
    mappers = [getattr(model, "hf_to_vllm_mapper", None)]
    quant = next((m.quant_config for m in (model, *model.children())
                  if getattr(m, "quant_config", None) is not None), None)
    for getter in ("get_cache_scale_mapper", "get_checkpoint_weight_mapper"):
        fn = getattr(quant, getter, None)
        if callable(fn):
            try:
                mappers.append(fn())
            except Exception as e:  # a config we cannot ask: plan nothing rather than guess
                logger.info("weightlift: %s.%s() failed (%s); nothing read straight into parameters",
                            type(quant).__name__, getter, e)
                return None
    return [t for m in mappers for t in (getattr(m, "weights_transforms", None) or [])]


# Torch functions a transform may call on a tensor without touching its
# values: metadata, and new tensors shaped like it (whisper's fake k bias).
_SHAPED_LIKE = {torch.zeros_like, torch.empty_like, torch.ones_like, torch.full_like}


def touched_by_transforms(model: torch.nn.Module,
                          tensors: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]) -> set[str]:
    """The checkpoint tensors (name, dtype, shape) the model's
    weights_transforms touch: the transforms run over meta-tensor probes of
    the checkpoint, and a tensor counts as untouched only when it comes out
    of them as the same object under the same name with no operation run on
    its values (a rename, a rewrite, a drop, a tensor held back or made
    anew: touched). A transform that fails on the probes touches everything."""
    tensors = list(tensors)
    transforms = weights_transforms(model)
    if transforms is None:
        return {n for n, _, _ in tensors}
    if not transforms:
        return set()
    probes = {n: torch.empty(shape, dtype=dtype, device="meta") for n, dtype, shape in tensors}
    source = {id(t): n for n, t in probes.items()}
    touched: set[str] = set()
    passed: set[str] = set()

    class _Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func not in _META and func not in _SHAPED_LIKE:
                for a in torch.utils._pytree.tree_flatten((args, kwargs))[0]:
                    if isinstance(a, torch.Tensor) and id(a) in source:
                        touched.add(source[id(a)])
            return func(*args, **kwargs)

    try:
        with _Watch():
            stream = iter(probes.items())
            for transform in transforms:
                stream = transform(stream)
            for name, t in stream:
                origin = source.get(id(t))
                if origin == name:
                    passed.add(name)
                else:
                    touched.add(name)
                    if origin is not None:
                        touched.add(origin)
    except Exception as e:
        logger.info("weightlift: the model's weights_transforms cannot run on metadata (%s); nothing read "
                    "straight into parameters", e)
        return set(probes)
    return touched | (set(probes) - passed)


def mappable(pl: Placement) -> bool:
    """Whether the parameter can simply *be* the checkpoint's bytes: the
    placement is the whole parameter and its bytes are one contiguous range
    of the file (the whole tensor, or a TP shard along dim 0)."""
    return pl.whole and (pl.shard is None or pl.shard[0] == 0) and pl.region.device.type == "cpu"


def map_into(params: dict, pl: Placement, full: torch.Tensor) -> bool:
    """Makes the placement's parameter (params: the model's
    named_parameters(remove_duplicate=False), as make_plan saw them) hold
    `full` (the checkpoint tensor, a zero-copy view of the file's pages;
    narrowed to the shard) instead of its own memory, and the placement's
    region that memory. False (nothing changed) when it does not fit."""
    t = full.narrow(*pl.shard) if pl.shard is not None else full
    if t.dtype != pl.dtype or tuple(t.shape) != tuple(pl.region.shape) or not t.is_contiguous():
        return False
    param = params.get(pl.param_name)
    if param is None or param.data_ptr() != pl.region.data_ptr():
        return False
    param.data = t
    pl.region = param.data
    return True


def check_placements(plan: Plan, materializer: Materializer | None = None) -> tuple[list[Placement], list[Placement]]:
    """After the model's load_weights: (loose, clashing) placements.

    A placement the model did not confirm was either rewritten by the model
    from the real bytes (a transposing loader: fine), or left as the engine
    wrote it. Told apart by comparing the region with the checkpoint's bytes
    (read through `materializer`; only for unconfirmed placements, which are
    rare). Left as written and overlapping a confirmed region: clashing (the
    parameter may hold bytes the model did not put there); otherwise loose
    (the parameter holds checkpoint bytes where the model kept its own values)."""
    confirmed = [p for p in plan.placements.values() if p.confirmed]
    spans = sorted((p.region.data_ptr(), p.region.data_ptr() + p.nbytes) for p in confirmed)
    loose, clashing = [], []
    for p in plan.placements.values():
        if p.confirmed or p.written:
            continue
        if materializer is not None:
            real = materializer.full(p, verify=True)
            if p.shard is not None:
                real = real.narrow(*p.shard)
            if not _bytes_equal(real, p.region):
                p.written = True
                continue
        a, b = p.region.data_ptr(), p.region.data_ptr() + p.nbytes
        if any(s < b and a < e for s, e in spans):
            clashing.append(p)
        else:
            loose.append(p)
    return loose, clashing


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    a = a.to(b.device)
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


# ---- the stand-ins ---------------------------------------------------------------------------------

# Functions that only read metadata: answered by the stand-in itself.
_META = set()
for _n in ("size", "dim", "numel", "nelement", "element_size", "is_contiguous", "stride", "is_floating_point",
           "is_complex", "get_device", "__len__", "ndimension", "is_signed", "storage_offset"):
    if hasattr(torch.Tensor, _n):
        _META.add(getattr(torch.Tensor, _n))
for _n in ("shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "layout", "requires_grad",
           "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "itemsize", "nbytes", "is_leaf", "names",
           "grad_fn", "grad", "is_xpu", "is_mps", "is_hpu"):
    _attr = getattr(torch.Tensor, _n, None)
    if _attr is not None and hasattr(_attr, "__get__"):
        _META.add(_attr.__get__)
_NARROW = {torch.Tensor.narrow, torch.narrow}
_ALIAS = {torch.Tensor.detach, torch.detach}
_DATA_GET = torch.Tensor.data.__get__
_TO = {torch.Tensor.to, torch.Tensor.type_as}
_SAME_SHAPE = {torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.view_as, torch.Tensor.reshape_as}


class Materializer:
    """Reads a checkpoint tensor's real bytes when a stand-in cannot serve an
    operation (`read(name) -> torch.Tensor` of the full tensor); counts it."""

    def __init__(self, read: Callable[[str], torch.Tensor]):
        self._read = read
        self._lock = threading.Lock()
        self.count = 0
        self.bytes = 0
        self.names: list[str] = []
        self.verified_bytes = 0

    def full(self, pl: Placement, verify: bool = False) -> torch.Tensor:
        """The tensor's bytes from its file. verify: for check_placements
        (counted apart, in verified_bytes)."""
        t = self._read(pl.name)
        n = t.numel() * t.element_size()
        with self._lock:
            if verify:
                self.verified_bytes += n
                return t
            self.count += 1
            self.bytes += n
            if len(self.names) < 8:
                self.names.append(pl.name)
        pl.materialized += 1
        return t


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _as_narrow(t: PlannedTensor, index):
    """(dim, start, length) when `index` is t[...] selecting a step-1 range of
    one dimension (or everything); None otherwise."""
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index) or len(index) > t.dim():
        return None
    out = None
    for d, s in enumerate(index):
        if not isinstance(s, slice) or s.step not in (None, 1):
            return None
        start, stop, _ = s.indices(t.shape[d])
        if (start, stop) == (0, t.shape[d]):
            continue
        if out is not None:
            return None
        out = (d, start, max(stop - start, 0))
    return out or (0, 0, t.shape[0] if t.dim() else 0)


class PlannedTensor(torch.Tensor):
    """The model's view of a checkpoint tensor the engine placed already: the
    checkpoint's shape and dtype, no storage of its own (see the module doc)."""

    @staticmethod
    def __new__(cls, placement: Placement, materializer: Materializer, part: str = "full",
                shard_data: torch.Tensor | None = None):
        shape = placement.full_shape if part == "full" else placement.shard_shape
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=placement.dtype, device=placement.region.device)
        t._pl = placement
        t._mat = materializer
        t._part = part
        t._shard_data = shard_data  # a read shard in new memory (sharded, not placed)
        t._real = None
        return t

    def __repr__(self):
        return f"PlannedTensor({self._pl.name}, {self._part}, shape={tuple(self.shape)}, dtype={self.dtype})"

    # The real tensor this stand-in is (read on first need; kept, so that
    # in-place changes the model makes stick).
    def _materialize(self) -> torch.Tensor:
        if self._real is None:
            pl = self._pl
            if self._part == "full":
                self._real = self._mat.full(pl)
            elif self._shard_data is not None:
                self._real = self._shard_data
            else:
                dim, start, length = pl.shard if pl.shard is not None else (0, 0, pl.full_shape[0])
                self._real = self._mat.full(pl).narrow(dim, start, length)
        return self._real

    def _same_target(self, args, kwargs) -> bool:
        """.to(...) / .type_as(...) that would return the tensor itself."""
        if kwargs.get("copy") or kwargs.get("memory_format") not in (None, torch.preserve_format):
            return False
        wanted = list(args) + [kwargs[k] for k in ("device", "dtype", "other") if k in kwargs]
        for w in wanted:
            if isinstance(w, torch.Tensor):
                if w.dtype != self.dtype:
                    return False
            elif isinstance(w, torch.dtype):
                if w != self.dtype:
                    return False
            elif isinstance(w, (str, torch.device)):
                if torch.device(w) != self.device and not (torch.device(w).type == self.device.type
                                                           and torch.device(w).index is None):
                    return False
            elif isinstance(w, bool):  # non_blocking
                continue
            else:
                return False
        return True

    def _narrowed(self, dim: int, start: int, length: int):
        pl = self._pl
        if dim < 0:
            dim += self.dim()
        if self.dim() and (start, length) == (0, self.shape[dim]):
            return self
        if self._part == "full" and pl.shard is not None and (dim, start, length) == pl.shard:
            return PlannedTensor(pl, self._mat, "shard", self._shard_data)
        return None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _META:
            with _no_subclass():
                return func(*args, **kwargs)
        self = args[0] if args else None
        if isinstance(self, PlannedTensor) and self._real is None:
            if func in _NARROW:
                given = list(args[1:]) + [kwargs[k] for k in ("dim", "start", "length") if k in kwargs]
                if len(given) == 3 and all(isinstance(v, int) for v in given):
                    r = self._narrowed(*given)
                    if r is not None:
                        return r
            elif func is torch.Tensor.__getitem__ and len(args) == 2:
                n = _as_narrow(self, args[1])
                if n is not None:
                    r = self._narrowed(*n)
                    if r is not None:
                        return r
            elif func in _ALIAS or func is _DATA_GET:
                return type(self)(self._pl, self._mat, self._part, self._shard_data)
            elif func is torch.Tensor.contiguous:
                return self
            elif func in _TO and self._same_target(args[1:], kwargs):
                return self
            elif func in _SAME_SHAPE and len(args) >= 2:
                shape = args[1].shape if isinstance(args[1], torch.Tensor) else (
                    tuple(args[1]) if isinstance(args[1], (tuple, list, torch.Size)) else tuple(args[1:]))
                if tuple(shape) == tuple(self.shape):
                    return self
        if func is torch.Tensor.copy_ and len(args) >= 2 and isinstance(args[1], PlannedTensor) \
                and not isinstance(args[0], PlannedTensor):
            dst, src = args[0], args[1]
            pl = src._pl
            if src._real is None and (src._part == "shard" or pl.shard is None) and src._shard_data is None \
                    and _same_memory(dst, pl.region):
                pl.confirmed = True
                return dst
            real = src._materialize()
            with _no_subclass():
                out = dst.copy_(real, *args[2:], **kwargs)
            if dst.data_ptr() == pl.region.data_ptr() and dst.numel() >= pl.region.numel():
                pl.written = True
            return out
        # Anything else runs on the real bytes.
        args, kwargs = _real_tree((args, kwargs))
        with _no_subclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = _real_tree((args, kwargs or {}))
        return func(*args, **kwargs)


def _real_tree(obj):
    if isinstance(obj, PlannedTensor):
        return obj._materialize()
    if isinstance(obj, tuple):
        return tuple(_real_tree(o) for o in obj)
    if isinstance(obj, list):
        return [_real_tree(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _real_tree(v) for k, v in obj.items()}
    return obj


def sharded_standin(name: str, dtype: torch.dtype, full_shape, shard: tuple[int, int, int], shard_data: torch.Tensor,
                    materializer: Materializer) -> PlannedTensor:
    """A full-shape stand-in for a tensor read as this rank's shard only
    (`shard_data`, new memory): narrow()ing it onto the shard gives
    `shard_data`; anything else reads the whole tensor from its file."""
    pl = Placement(name, dtype, tuple(full_shape), "", shard_data, shard)
    pl.confirmed = True  # nothing of it was written into a parameter
    return _ShardStandin(pl, materializer, "full", shard_data)


class _ShardStandin(PlannedTensor):
    def _narrowed(self, dim, start, length):
        if dim < 0:
            dim += self.dim()
        if (dim, start, length) == self._pl.shard:
            return self._shard_data
        return super()._narrowed(dim, start, length)

"""The `weightlift` load format: vLLM's DefaultModelLoader with weightlift's
engine underneath (imported only where vLLM is installed).

What stays vLLM's: the model's own load_weights() (name mapping, stacked
q/k/v and gate/up, TP slicing through each parameter's weight_loader), the
weights tracking, process_weights_after_loading, the EP / encoder-only
filters. What changes: where the files come from (local folders; Hub repos
loaded while they download; s3:// and gs:// URLs), how bytes move (the
engine's threads; tensors that land unchanged in a parameter are read
straight into it, see _direct.py), and who reads them (the ranks of a
tensor-parallel group read the checkpoint once in total).
"""
from __future__ import annotations

import fnmatch
import glob
import logging
import os
import time
import weakref
from collections.abc import Generator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from vllm.config import ModelConfig
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from .. import _engine, _hub
from .._engine import iterate, open_stream, tensors
from .._tensors import TORCH_DTYPES, TORCH_TO_NAME
from .._tensors import nbytes as _nbytes
from . import _affinity, _collect, _direct, _progress
from . import _read_ahead as _early
from ._options import Options, map_params_on

logger = logging.getLogger("weightlift.vllm")

OBJECT_SCHEMES = _engine.OBJECT_SCHEMES  # the engine's (s3.h)
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
# Finished tensors the engine may keep ready ahead of the model (views of
# the page cache mapped in, or owned memory for cold files).
_LOOKAHEAD_BYTES = 64 << 20


# Models whose first load_weights ran through this plug-in (any loader
# instance: vLLM builds a fresh loader for every reload).
_LOADED_MODELS: weakref.WeakSet = weakref.WeakSet()


is_object_url = _engine.is_object_url


def _parallel():
    """(tp_rank, tp_size, the TP group's CPU process group or None)."""
    try:
        from vllm.distributed import parallel_state as ps

        tp = ps.get_tp_group()
        return tp.rank_in_group, tp.world_size, (tp.cpu_group if tp.world_size > 1 else None)
    except Exception:  # no parallel state (a loader used on its own)
        return 0, 1, None


class WeightliftModelLoader(DefaultModelLoader):
    """`--load-format weightlift`. Options: `--model-loader-extra-config`
    (see _options.Options); DefaultModelLoader's own keys pass through."""

    def __init__(self, load_config: LoadConfig):
        self.options, rest = Options.parse(dict(load_config.model_loader_extra_config or {}))
        # DefaultModelLoader rejects keys it does not know: show it only its own.
        original = load_config.model_loader_extra_config
        load_config.model_loader_extra_config = rest
        try:
            super().__init__(load_config)
        finally:
            load_config.model_loader_extra_config = original
        self._model: nn.Module | None = None
        self._hub_sources: dict = {}
        self._first_load_of: nn.Module | None = None
        self._early: _early.EarlyReads | None = None
        self._touch: _early.FirstTouch | None = None
        self._collector = None  # _collect._Collector during load_model with reads in flight
        # Inside load_model with reads in flight: mapped parameters' pages are
        # read while vLLM post-processes (_read_ahead.LateResidency), waited
        # for before load_model returns.
        self._residency_late = False
        self._late: _early.LateResidency | None = None

    def load_model(self, vllm_config, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        """vLLM's load_model (construction, load_weights, post-processing) with
        the checkpoint's reads started before construction (_read_ahead.py);
        load_weights() places from what they read; vLLM's first full garbage
        collection runs after construction, while they read (_collect.py);
        the last pages of mapped parameters are read while vLLM
        post-processes (_read_ahead.LateResidency), all in memory when this
        returns. freeze_gc: the heap that existed before frozen for its
        length (_collect.frozen_heap)."""
        with _collect.frozen_heap() if self.options.freeze_gc else nullcontext():
            return self._load_model(vllm_config, model_config, prefix)

    def _load_model(self, vllm_config, model_config: ModelConfig, prefix: str) -> nn.Module:
        self._early = _early.start(self, model_config, _parallel()[1])
        try:
            if self._early is None:
                return super().load_model(vllm_config, model_config, prefix)
            self._residency_late = True
            if self.options.collect_early:
                with _collect.moved_collection() as self._collector:
                    model = super().load_model(vllm_config, model_config, prefix)
            else:
                model = super().load_model(vllm_config, model_config, prefix)
            self._wait_late_residency()
            return model
        finally:
            self._residency_late = False
            if self._late is not None:  # load_model failed: the thread is joined, its outcome dropped
                late, self._late = self._late, None
                try:
                    late.wait()
                except Exception as e:
                    logger.debug("weightlift: residency after a failed load_model: %s", e)
            self._collector = None
            early, self._early = self._early, None
            if early is not None:
                early.close()
            self._stop_first_touch()

    def create_model(self, vllm_config, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        """vLLM's construction, each host parameter's pages faulted in on an
        engine thread as it is allocated (_read_ahead.FirstTouch); then, with
        reads in flight, vLLM's first full garbage collection (_collect.py)."""
        if not (self.options.prefault and self.options.into_params):
            model = super().create_model(vllm_config, model_config, prefix)
        else:
            # Its thread runs beside the construction, not on its core.
            with _affinity.widened(self.options.cpus, beside=True):
                self._touch = _early.FirstTouch()
            with self._touch:
                model = super().create_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
        if self._collector is not None:
            self._collector.collect_now()
        return model

    def _map_params(self, model, direct, files, unprefixed, common, stats) -> None:
        # Inside load_model the pages are read later (LateResidency): the views come unread.
        _map_params_impl(model, direct, files, unprefixed, common, stats, unread=self._residency_late)

    def _wait_late_residency(self) -> None:
        """The end of load_model: every mapped page in memory (LateResidency);
        a file truncated under its mapping fails the load here."""
        late, self._late = self._late, None
        if late is None:
            return
        got = late.wait()
        stats = getattr(self, "last_stats", None)
        if stats is not None:
            stats["mapped_populate"] = got
            _progress.dump_stats(stats)

    def _stop_first_touch(self) -> dict:
        touch, self._touch = self._touch, None
        return touch.stop() if touch is not None else {}

    # ---- which files ------------------------------------------------------------------------------

    def _format(self, model_name_or_path: str, revision: str | None) -> str:
        fmt = self.options.format
        if fmt == "auto":
            fmt = "hf"
            if not is_object_url(model_name_or_path):
                try:
                    from vllm.transformers_utils.repo_utils import list_filtered_repo_files

                    if list_filtered_repo_files(model_name_or_path=model_name_or_path,
                                                allow_patterns=["consolidated*.safetensors"], revision=revision):
                        fmt = "mistral"
                except Exception as e:  # offline, no such repo: vLLM's "hf" choice
                    logger.debug("mistral format check skipped: %s", e)
        return fmt

    def _prepare_weights(self, model_name_or_path: str, subfolder: str | None, revision: str | None,
                         fall_back_to_pt: bool, allow_patterns_overrides: list[str] | None):
        """vLLM's file selection (DefaultModelLoader._prepare_weights for
        load_format `auto`, or the `format` option), with the engine's sources:
        object-storage URLs listed by the engine, Hub repositories loaded while
        they download. Returns (folder, files, use_safetensors, index_file)."""
        from weightlift.vllm_compat import (
            download_safetensors_index_file_from_hf,
            download_weights_from_hf,
            filter_duplicate_safetensors_files,
            filter_files_not_needed_for_inference,
        )

        model_name_or_path = _hub.maybe_download_from_modelscope(model_name_or_path, revision) or model_name_or_path
        fmt = self._format(model_name_or_path, revision)
        use_safetensors = False
        index_file = SAFE_WEIGHTS_INDEX_NAME
        if fmt == "hf":
            allow_patterns = ["*.safetensors", "*.bin"]
        elif fmt == "safetensors":
            use_safetensors, allow_patterns = True, ["*.safetensors"]
        elif fmt == "mistral":
            use_safetensors, allow_patterns = True, ["consolidated*.safetensors"]
            index_file = "consolidated.safetensors.index.json"
        elif fmt == "pt":
            allow_patterns = ["*.pt"]
        else:  # npcache
            allow_patterns = ["*.bin"]
        if fall_back_to_pt and not use_safetensors:
            allow_patterns += ["*.pt"]
        if allow_patterns_overrides is not None:
            allow_patterns = allow_patterns_overrides

        if is_object_url(model_name_or_path):
            return self._object_files(model_name_or_path, subfolder, fmt, allow_patterns,
                                      allow_patterns_overrides is not None, use_safetensors, index_file)

        is_local = os.path.isdir(model_name_or_path)
        if not is_local:
            # vLLM's default ignore_patterns (["original/**/*"]) leave the
            # repository's own weights alone; _hub_files checks its choice against them.
            streaming = fmt == "hf" and subfolder is None and allow_patterns_overrides is None
            if streaming:
                found = self._hub_files(model_name_or_path, revision)
                if found is not None:
                    return found
            hf_folder = download_weights_from_hf(model_name_or_path, self.load_config.download_dir, allow_patterns,
                                                 revision, subfolder=subfolder,
                                                 ignore_patterns=self.load_config.ignore_patterns)
        else:
            hf_folder = model_name_or_path
        if subfolder is not None:
            hf_folder = os.path.join(hf_folder, subfolder)

        files: list[str] = []
        for pattern in allow_patterns:
            files += glob.glob(os.path.join(hf_folder, pattern))
            if files:
                if pattern.endswith(".safetensors"):
                    use_safetensors = True
                break
        if use_safetensors:
            if not is_local and len(files) > 1:
                download_safetensors_index_file_from_hf(model_name_or_path, index_file,
                                                        cache_dir=self.load_config.download_dir,
                                                        subfolder=subfolder, revision=revision)
            if allow_patterns_overrides is None:
                files = filter_duplicate_safetensors_files(files, hf_folder, index_file)
        else:
            files = filter_files_not_needed_for_inference(files)
        if not files:
            raise RuntimeError(f"Cannot find any model weights with `{model_name_or_path}`")
        return hf_folder, files, use_safetensors, index_file

    def _hub_files(self, repo: str, revision: str | None):
        """A Hub repository's weights through the engine's load-while-downloading
        (HubSource): the tensors are read as their bytes arrive, into the same
        cache a plain download fills. None when the repository has no weights
        it can stream (then vLLM's download path runs)."""
        key = (repo, revision or "main", self.load_config.download_dir or "")
        source = self._hub_sources.get(key)
        if source is None:
            source = _hub.hub_source(repo, revision, self.load_config.download_dir)
            self._hub_sources[key] = source
        files = list(source.weight_files)
        if not files:
            return None
        ignore = self.load_config.ignore_patterns or []
        if isinstance(ignore, str):
            ignore = [ignore]
        rel = [os.path.relpath(f, source.folder) for f in files]
        if any(fnmatch.fnmatch(r, p) for r in rel for p in ignore):
            logger.info("%s: its weight files match ignore_patterns %s; downloading as vLLM does", repo, ignore)
            return None
        use_safetensors = all(f.endswith(".safetensors") for f in files)
        logger.info("Loading %s while it downloads (%d files, %d still arriving)", repo, len(files),
                    len(source.pending))
        return source.folder, _engine.natural_sort(files), use_safetensors, SAFE_WEIGHTS_INDEX_NAME

    def _object_files(self, url: str, subfolder: str | None, fmt: str, allow_patterns: list[str],
                      overridden: bool, use_safetensors: bool, index_file: str):
        """An object-storage prefix listed by the engine (its S3/GCS source),
        with vLLM's selection: `hf` (no override) the engine's own (index
        de-duplication, *.safetensors, else *.bin, else *.pt, training files
        dropped); otherwise the first of `allow_patterns` that matches a file
        of the prefix (vLLM's glob loop), safetensors de-duplicated with the
        index unless the model overrode the patterns. Naturally sorted."""
        from weightlift.vllm_compat import filter_duplicate_safetensors_files, filter_files_not_needed_for_inference

        folder = url.rstrip("/")
        if subfolder:
            folder = f"{folder}/{subfolder}"
        if fmt == "npcache":
            raise ValueError(f"{url}: format 'npcache' converts files on a local disk; it does not read "
                             f"object storage (use 'auto' or 'hf')")
        if fmt == "hf" and not overridden:
            files, kind = _engine.find_weight_files(folder)
            if not files:
                raise RuntimeError(f"Cannot find any model weights with `{url}`")
            return folder, list(files), kind == "safetensors", index_file
        names = [n for n, is_dir, _ in _engine.list_dir(folder) if not is_dir]
        files: list[str] = []
        for pattern in allow_patterns:
            files = [f"{folder}/{n}" for n in names if fnmatch.fnmatchcase(n, pattern)]
            if files:
                use_safetensors = use_safetensors or pattern.endswith(".safetensors")
                break
        if use_safetensors and not overridden:
            files = filter_duplicate_safetensors_files(files, folder, index_file)  # the index read through the Env
        elif not use_safetensors:
            files = filter_files_not_needed_for_inference(files)
        if not files:
            raise RuntimeError(f"Cannot find any model weights with `{url}` (patterns {allow_patterns})")
        return folder, _engine.natural_sort(files), use_safetensors, index_file

    def download_model(self, model_config: ModelConfig) -> None:
        self._prepare_weights(self._weights_location(model_config), None, model_config.revision, True, None)

    @staticmethod
    def _weights_location(model_config: ModelConfig) -> str:
        # An object-storage model: vLLM keeps the URL in model_weights and
        # model_config.model is the local folder of its configs.
        return getattr(model_config, "model_weights", "") or model_config.model

    # ---- the weights -------------------------------------------------------------------------------

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        """vLLM's load_weights (model.load_weights over get_all_weights, the
        weights tracking); the model's first one may write into parameters."""
        with self._first_load(model):
            super().load_weights(model, model_config)

    @contextmanager
    def _first_load(self, model: nn.Module):
        self._first_load_of = model if model not in _LOADED_MODELS else None
        try:
            yield
        finally:
            self._first_load_of = None
            _LOADED_MODELS.add(model)

    def _is_first_load(self, model: nn.Module | None) -> bool:
        """Which caller is this: True only inside the model's first
        load_weights (through this loader's load_weights, as load_model runs
        it), where the parameters hold nothing yet and the model takes every
        tensor, so the engine may write straight into them. Every other caller
        of get_all_weights gets a plain stream: reload_weights (a fresh loader;
        parameters on meta, or views of processed weights under 0.34's
        VLLM_RELOAD_MODE=direct), EPLB's redistribution (a fresh loader whose
        caller keeps a few MoE layers of a serving model), a second
        load_weights of the same model, any future caller."""
        return model is not None and model is self._first_load_of

    def get_all_weights(self, model_config: ModelConfig, model: nn.Module):
        self._model = model
        if is_object_url(getattr(model_config, "model_weights", "") or ""):
            # The primary source is the object-storage URL, not the configs folder.
            primary = DefaultModelLoader.Source(
                model_config.model_weights, model_config.revision, prefix="",
                fall_back_to_pt=getattr(model, "fall_back_to_pt_during_load", True),
                allow_patterns_overrides=getattr(model, "allow_patterns_overrides", None),
                is_unused_weight=getattr(model, "is_unused_checkpoint_weight", None))
            yield from self._get_weights_iterator(primary)
            for source in getattr(model, "secondary_weights", ()):
                yield from self._get_weights_iterator(source)
            return
        yield from super().get_all_weights(model_config, model)

    def _get_weights_iterator(self, source) -> Generator[tuple[str, torch.Tensor], None, None]:
        if self.counter_before_loading_weights == 0.0:
            self.counter_before_loading_weights = time.perf_counter()
        hf_folder, files, use_safetensors, index_file = self._prepare_weights(
            source.model_or_path, source.subfolder, source.revision, source.fall_back_to_pt,
            source.allow_patterns_overrides)
        files = self._filter_files(source, hf_folder, files, use_safetensors, index_file)
        prefix = source.prefix
        if self.options.format == "npcache":
            from weightlift.vllm_compat import np_cache_weights_iterator

            it = np_cache_weights_iterator(source.model_or_path, self.load_config.download_dir, hf_folder, files,
                                           self.load_config.use_tqdm_on_load)
            return ((prefix + n, t) for n, t in it)
        location = self.load_config.pt_load_map_location
        if not use_safetensors and location not in (None, "cpu") and location != {"": "cpu"}:
            from weightlift.vllm_compat import pt_weights_iterator

            it = pt_weights_iterator(files, self.load_config.use_tqdm_on_load, location)
            return ((prefix + n, t) for n, t in it)
        return self._weights_then_finish(files, prefix)

    def _weights_then_finish(self, files, prefix):
        yield from self._engine_weights(files, prefix)
        # Hub repositories loaded while downloading: every blob verified and
        # linked into the cache (the load itself already waited for their bytes).
        for key, source in list(self._hub_sources.items()):
            source.finish()
            del self._hub_sources[key]

    def _filter_files(self, source, hf_folder, files, use_safetensors, index_file):
        """vLLM 0.32's shard filters (encoder-only models, unused weights)."""
        from weightlift.vllm_compat import (
            filter_mm_encoder_only_safetensors_files,
            filter_safetensors_files_by_weight_name,
        )

        if getattr(self, "_encoder_only_lm_prefixes", None) is not None and use_safetensors and files:
            files = filter_mm_encoder_only_safetensors_files(files, hf_folder, index_file,
                                                             self._encoder_only_lm_prefixes,
                                                             weights_mapper=self._encoder_only_weights_mapper)
            if not files:
                raise RuntimeError(f"mm-encoder-only shard filter removed all weight files for "
                                   f"`{source.model_or_path}`")
        if getattr(source, "is_unused_weight", None) is not None and use_safetensors:
            files = filter_safetensors_files_by_weight_name(files, source.is_unused_weight)
        return files

    def _listed(self, files: list[str]) -> tuple[list[tuple[str, str, tuple]], dict[str, str]]:
        """Every tensor of `files` this rank loads, vLLM's expert filter
        (should_skip_weight over local_expert_ids) applied: ([(name, dtype,
        shape)], {name: file})."""
        from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

        experts = self.local_expert_ids
        file_of: dict[str, str] = {}
        listed = []
        for f in files:
            for name, dtype, shape in _engine.list_tensors([f]):
                if experts is not None and should_skip_weight(name, experts):
                    continue
                file_of[name] = f
                listed.append((name, dtype, tuple(shape)))
        return listed, file_of

    def _shuffled(self, files: list[str], distributed: bool) -> list[str]:
        """LoadConfig.shuffle_safetensors_files (vLLM 0.34): each rank reads the
        files in its own order (vLLM's rank-seeded permutation). Not with the
        distributed read, whose plan the ranks must agree on (there each file
        is read by one rank anyway)."""
        if not getattr(self.load_config, "shuffle_safetensors_files", False) or len(files) < 2:
            return files
        if distributed:
            logger.info("weightlift: shuffle_safetensors_files: the ranks read the checkpoint once in total, "
                        "each its own part; the file order is the plan's")
            return files
        if not all(f.endswith(".safetensors") for f in files):
            return files
        from weightlift.vllm_compat import _shuffle_files

        return _shuffle_files(files)

    def _plain_weights(self, files: list[str], prefix: str) -> Generator[tuple[str, torch.Tensor], None, None]:
        """The stream every caller but the model's first load_weights gets:
        the engine's tensors (views of the page cache, or owned memory for
        cold files), whole, in checkpoint order, as vLLM's own iterators give
        them; nothing is written into a parameter and nothing is exchanged
        between ranks, so a caller that keeps only some tensors (EPLB's few
        MoE layers) changes only what it keeps. The expert filter and
        shuffle_safetensors_files apply as in vLLM's iterators."""
        opts = self.options
        t0 = time.perf_counter()
        listed, _ = self._listed(files)
        files = self._shuffled(files, distributed=False)
        tp_rank, tp_size, _ = _parallel()
        extra = {} if self.local_expert_ids is None else {"local_expert_ids": sorted(self.local_expert_ids)}
        stats = {"caller": "stream", "model_tensors": 0, "model_bytes": 0, "tp_rank": tp_rank, "tp_size": tp_size,
                 "files": len(files), "total_bytes": sum(_nbytes(d, s) for _, d, s in listed)}
        logger.info("weightlift: %d checkpoint files as a plain stream (not the model's first load_weights: "
                    "nothing is written into parameters)", len(files))
        with _affinity.widened(opts.cpus):  # the stream's threads start here
            stream = open_stream(files, max_queued_bytes=max(opts.max_memory // 4, _LOOKAHEAD_BYTES), ordered=True,
                                 strategy=opts.strategy, order="name", file_views=True, **opts.engine(**extra))
        p: dict = {}
        for name, t in tensors(stream, files, stats=p):
            stats["model_tensors"] += 1
            stats["model_bytes"] += t.numel() * t.element_size()
            yield prefix + name, t
        _progress.log_plan(p)
        stats.update(bytes_read=p.get("bytes_read", 0), strategy=p.get("strategy"),
                     seconds=time.perf_counter() - t0)
        logger.info("weightlift: %.2f GiB (%d tensors) streamed in %.2f s", stats["model_bytes"] / 1024**3,
                    stats["model_tensors"], stats["seconds"])
        _progress.dump_stats(stats, kind="stream")

    def _engine_weights(self, files: list[str], prefix: str) -> Generator[tuple[str, torch.Tensor], None, None]:
        """(name, tensor) of every tensor of `files` for the caller. In the
        model's first load_weights: first the tensors the engine read straight
        into parameters (stand-ins), then the rest as the engine hands them
        over. Any other caller: _plain_weights."""
        files = [os.fspath(f) for f in files]
        if not self._is_first_load(self._model):
            yield from self._plain_weights(files, prefix)
            return
        opts = self.options
        model = self._model
        t0 = time.perf_counter()
        listed, file_of = self._listed(files)
        tp_rank, tp_size, group = _parallel()
        device_type = _param_device_type(model)
        plan = _direct.Plan()
        if opts.into_params:
            plannable = [(prefix + n, TORCH_DTYPES[d], s) for n, d, s in listed if d in TORCH_DTYPES]
            # vLLM 0.34's WeightsMapper.weights_transforms rewrite the stream before
            # the name mapping: the tensors they touch are left to the model.
            touched = _direct.touched_by_transforms(model, plannable)
            if touched:
                logger.info("weightlift: %d tensor(s) the model's weights_transforms touch go through its "
                            "load_weights", len(touched))
            plannable = [t for t in plannable if t[0] not in touched]
            plan = _direct.make_plan(model, plannable, tp_rank, tp_size, device_type)
        unprefixed = {prefix + n: n for n, _, _ in listed}
        shapes = {n: s for n, _, s in listed}

        def read_full(name: str) -> torch.Tensor:
            n = unprefixed[name]
            for _, t in iterate([file_of[n]], max_queued_bytes=1 << 62, only=[n], file_views=True):
                return t
            raise KeyError(n)

        mat = _direct.Materializer(read_full)
        collective = None
        if group is not None and opts.distributed != "off":
            from .._distributed import collective_for_group

            collective = collective_for_group(group)
        files = self._shuffled(files, collective is not None)
        common = dict(tp_rank=tp_rank, tp_size=tp_size) if tp_size > 1 else {}
        # CUDA parameters: the engine fills them through its pinned staging ring.
        into_device = dict(device=f"cuda:{torch.cuda.current_device()}") if device_type == "cuda" else {}
        if collective is not None:
            common["collective"] = collective
        if self.local_expert_ids is not None:
            common["local_expert_ids"] = sorted(self.local_expert_ids)

        early = self._early
        if early is not None:
            stats_early = early.placement_starts()
            common.update(early.engine_options())
            if not early.remote and opts.direct_io == "auto" and early.covers_everything():
                # Every byte is in the page cache or on its way into it: the
                # load reads through it (O_DIRECT would read from the disk again).
                common["direct"] = "off"
        total_bytes = sum(_nbytes(d, s) for _, d, s in listed)
        bar = _progress.FileBar(files, file_of, self.load_config.use_tqdm_on_load)
        _progress.log_start(files, total_bytes, tp_size, collective is not None, opts)
        stats = {"direct_tensors": 0, "direct_bytes": 0, "model_tensors": 0, "model_bytes": 0, "bytes_read": 0,
                 "bytes_exchanged": 0, "direct_seconds": 0.0, "rss_start": _progress.rss_bytes()}
        if early is not None:
            stats["read_ahead"] = stats_early
        touched = self._stop_first_touch()  # placement starts: the copies take the CPUs
        if touched:
            stats["first_touch"] = touched
        try:
            direct = {prefix_n: pl for prefix_n, pl in plan.placements.items()}
            if direct and early is not None and not early.remote and early.covers_everything():
                mapping, why = map_params_on(opts.map_params, _fs_types(files))
                stats["map_params"] = why
                logger.info("weightlift: %s", why)
                if mapping:
                    self._map_params(model, direct, files, unprefixed, common, stats)
            direct = {n: pl for n, pl in direct.items() if n not in stats.get("mapped", ())}
            if direct:
                t1 = time.perf_counter()
                items = [(unprefixed[n], pl.region.data_ptr(), pl.nbytes, TORCH_TO_NAME[pl.dtype],
                          list(pl.shard_shape)) for n, pl in direct.items()]
                rules = [r.replace(prefix, "", 1) if prefix else r for r in plan.shard_rules(direct)]
                # The read path is the engine's plan (auto into the caller's memory: the stream).
                with torch.no_grad(), _affinity.widened(opts.cpus):
                    s1 = _engine.load_into(files, items, strategy=opts.strategy, shard_rules=rules or None,
                                           **opts.engine(**common, **into_device))
                _progress.log_plan(s1)
                stats["direct_seconds"] += time.perf_counter() - t1
                stats["rss_after_direct"] = _progress.rss_bytes()
                stats["direct_tensors"] += len(items)
                stats["direct_bytes"] += sum(pl.nbytes for pl in direct.values())
                stats["bytes_read"] += s1.get("bytes_read", 0)
                stats["bytes_exchanged"] += s1.get("bytes_exchanged", 0)
                stats["direct_io"] = s1.get("direct_io")
                bar.done_tensors([unprefixed[n] for n in direct])
                for n, pl in direct.items():
                    yield n, _direct.PlannedTensor(pl, mat)
            mapped = stats.pop("mapped", ())
            bar.done_tensors([unprefixed[n] for n in mapped])
            for n in mapped:
                yield n, _direct.PlannedTensor(plan.placements[n], mat)

            rest = [n for n, _, _ in listed if prefix + n not in plan.placements]
            if rest:
                rules = [r.replace(prefix, "", 1) if prefix else r
                         for r in plan.shard_rules(prefix + n for n in rest)]
                with _affinity.widened(opts.cpus):  # the stream's threads start here
                    stream = open_stream(files, max_queued_bytes=max(opts.max_memory // 4, _LOOKAHEAD_BYTES),
                                         ordered=collective is None,
                                         exclude=[unprefixed[n] for n in plan.placements] or None,
                                         strategy=opts.strategy, order="name", file_views=True,
                                         shard_rules=rules or None, **opts.engine(**common))
                p: dict = {}
                for name, t in tensors(stream, files, stats=p):
                    stats["model_tensors"] += 1
                    stats["model_bytes"] += t.numel() * t.element_size()
                    pname = prefix + name
                    shard = plan.sharded.get(pname)
                    if shard is not None:
                        t = _direct.sharded_standin(pname, t.dtype, shapes[name], shard, t, mat)
                    bar.done_tensors([name])
                    yield pname, t
                _progress.log_plan(p)
                stats["bytes_read"] += p.get("bytes_read", 0)
                stats["bytes_exchanged"] += p.get("bytes_exchanged", 0)
                stats["strategy"] = p.get("strategy")
            if mapped:
                ranges = [(plan.placements[n].param_name, file_of[unprefixed[n]],
                           plan.placements[n].region.data_ptr(), plan.placements[n].nbytes) for n in mapped]
                if self._residency_late:
                    # Inside load_model: read on while vLLM post-processes; load_model waits for them.
                    self._wait_late_residency()  # (a second load_weights in one load_model: the first's first)
                    self._late = _early.LateResidency(ranges, [plan.placements[n].region for n in mapped],
                                                      opts.threads, opts.cpus)
                else:
                    # Every mapped page in memory before load_weights returns, as a copy leaves it.
                    t1 = time.perf_counter()
                    with _affinity.widened(opts.cpus):
                        got = _early.make_resident(ranges, threads=opts.threads)
                    stats["mapped_populate"] = got
                    stats["mapped_seconds"] += time.perf_counter() - t1
                    stats["direct_seconds"] += time.perf_counter() - t1
        finally:
            bar.close()
        stats["rss_end"] = _progress.rss_bytes()
        if early is not None:
            stats["read_ahead_end"] = early.progress()
        loose, clashing = _direct.check_placements(plan, mat)
        stats["seconds"] = time.perf_counter() - t0
        stats["materialized"] = mat.count
        stats["materialized_bytes"] = mat.bytes
        _progress.log_done(stats, len(plan.placements), loose, mat)
        stats.update(tp_rank=tp_rank, tp_size=tp_size, distributed=collective is not None,
                     placements=len(plan.placements), confirmed=sum(p.confirmed for p in plan.placements.values()),
                     loose=len(loose), total_bytes=total_bytes, files=len(files))
        self.last_stats = stats
        _progress.dump_stats(stats)
        # Let go of the parameters' memory: process_weights_after_loading may
        # replace them (CPU kernels repack weights), and a view kept here
        # would keep the old memory alive.
        plan.placements.clear()
        plan.sharded.clear()
        if clashing:
            names = ", ".join(p.name for p in clashing[:5])
            raise RuntimeError(
                f"weightlift: the model did not take {len(clashing)} tensor(s) it was expected to copy unchanged "
                f"({names}), and their bytes overlap parameters it did take: the weights may be wrong. Load "
                f"with --model-loader-extra-config '{{\"into_params\": false}}' and report the model at "
                f"weightlift's issue tracker.")


def _map_params_impl(model, direct: dict, files: list[str], unprefixed: dict, common: dict, stats: dict,
                     unread: bool = False) -> None:
    """map_params: every placement that is a whole host parameter whose bytes
    lie contiguously in the file becomes the checkpoint's bytes themselves:
    the parameter's storage is replaced by a zero-copy view of the file's
    pages (the engine's file views: a private copy-on-write mapping; the
    checkpoint is in the page cache, read ahead while the model was built).
    No fresh page is touched for it, no byte copied. Placements that are not
    mapped stay in `direct` for the engine's copy. `unread`: the views are
    handed over with their pages neither read nor mapped (the engine's
    populate_views off): the caller reads them in later (LateResidency)."""
    want = {unprefixed[n]: n for n, pl in direct.items() if _direct.mappable(pl)}
    if not want:
        return
    t0 = time.perf_counter()
    mapped: list[str] = []
    nbytes = 0
    params = dict(model.named_parameters(remove_duplicate=False))
    engine = {k: v for k, v in common.items() if k in ("direct", "threads", "read_ahead")}
    for name, t in iterate(files, only=list(want), file_views=True, populate_views=not unread, strategy="lazy",
                           ordered=False, max_queued_bytes=1 << 62, **engine):
        n = want[name]
        pl = direct[n]
        with torch.no_grad():
            if _direct.map_into(params, pl, t):
                mapped.append(n)
                nbytes += pl.nbytes
    stats["mapped"] = mapped
    stats["mapped_tensors"] = len(mapped)
    stats["mapped_bytes"] = nbytes
    stats["mapped_seconds"] = time.perf_counter() - t0
    # Straight into parameters, as the copied ones (direct_* counts both; mapped_* the mapped part).
    stats["direct_tensors"] += len(mapped)
    stats["direct_bytes"] += nbytes
    stats["direct_seconds"] += stats["mapped_seconds"]
    stats["bytes_read"] += nbytes  # taken from the files (through the page cache) as a copy would have


def _fs_types(files: list[str]) -> dict[str, str]:
    """{folder: the filesystem type serving it} for the files' folders."""
    return {d: _engine.filesystem_type(d) for d in {os.path.dirname(os.path.abspath(f)) for f in files}}


def _param_device_type(model: nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"

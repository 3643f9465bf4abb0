"""The plug-in and vllm_compat against vLLM 0.34 itself (PyPI's CUDA build,
imported on a machine without a GPU; run with the venv of
`scripts/vllm-venv --reqs tests/vllm034/requirements.txt`):

  * vLLM 0.34's plug-in loading registers `--load-format weightlift`;
  * WeightliftModelLoader satisfies 0.34's BaseModelLoader/DefaultModelLoader
    surface: every method vLLM calls on a loader, every method the plug-in
    overrides with 0.34's parameters, every vLLM name the plug-in imports;
  * the object-storage check the plug-in steps past is still the one it knows;
  * every function of 0.34's weight_utils and ep_weight_filter is in
    vllm_compat with a signature that takes 0.34's calls.
tests/vllm/test_loader_paths.py and tests/python/vllm_port/test_vllm034_names.py
run in the same venv (scripts/test)."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

if os.environ.get("WEIGHTLIFT_VLLM_REQUIRED") == "1":
    import vllm  # noqa: F401  (scripts/test: a failed import fails, never skips)
else:
    vllm = pytest.importorskip("vllm")

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "python" / "weightlift" / "vllm_plugin"


def test_this_is_vllm_034_with_its_torch():
    import torch
    import vllm

    assert vllm.__version__ == "0.34.0"
    assert torch.__version__.split("+")[0] == "2.14.0"


def test_vllms_plugin_loading_registers_the_format():
    code = """
import vllm.logger
from vllm.plugins import load_general_plugins
from vllm.model_executor.model_loader import get_model_loader, _LOAD_FORMAT_TO_MODEL_LOADER
from vllm.config.load import LoadConfig
load_general_plugins(); load_general_plugins()
loader = get_model_loader(LoadConfig(load_format="weightlift", model_loader_extra_config={"threads": 4},
                                     shuffle_safetensors_files=True))
print("RESULT", type(loader).__name__, loader.options.threads, loader.load_config.shuffle_safetensors_files)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("RESULT"))
    assert line.split()[1:] == ["WeightliftModelLoader", "4", "True"]
    assert (r.stdout + r.stderr).count("Registered model loader") <= 1


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def test_the_loader_has_every_method_vllm_calls_with_034s_parameters():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from weightlift.vllm_plugin._loader import WeightliftModelLoader

    assert issubclass(WeightliftModelLoader, DefaultModelLoader)
    assert not getattr(WeightliftModelLoader, "__abstractmethods__", None)
    # What vLLM calls on any loader (model runner, reload_weights, EPLB, the weight-cache daemon).
    for name in ("download_model", "load_weights", "load_model", "get_all_weights"):
        assert callable(getattr(WeightliftModelLoader, name)), name
        base = getattr(BaseModelLoader, name)
        assert _params(getattr(WeightliftModelLoader, name)) == _params(base), name
    # Every method the plug-in defines that DefaultModelLoader has: 0.34's parameters.
    ours = {n for n, v in vars(WeightliftModelLoader).items() if callable(v) and not n.startswith("__")}
    for name in sorted(ours & set(dir(DefaultModelLoader))):
        assert _params(getattr(WeightliftModelLoader, name)) == _params(getattr(DefaultModelLoader, name)), name
    assert "__init__" in vars(WeightliftModelLoader)
    assert _params(WeightliftModelLoader.__init__) == _params(DefaultModelLoader.__init__)
    # What the plug-in reads of DefaultModelLoader's state and of 0.34's Source and LoadConfig.
    fields = set(DefaultModelLoader.Source.__dataclass_fields__)
    assert {"model_or_path", "revision", "prefix", "fall_back_to_pt", "allow_patterns_overrides",
            "is_unused_weight", "subfolder"} <= fields
    from vllm.config.load import LoadConfig

    loader = WeightliftModelLoader(LoadConfig(load_format="weightlift"))
    for attr in ("counter_before_loading_weights", "local_expert_ids", "load_config"):
        assert hasattr(loader, attr), attr
    for attr in ("model_loader_extra_config", "download_dir", "ignore_patterns", "use_tqdm_on_load",
                 "pt_load_map_location", "shuffle_safetensors_files"):
        assert attr in LoadConfig.__dataclass_fields__, attr
    # DefaultModelLoader.load_weights runs through get_all_weights (the first load's only way in).
    assert "self.get_all_weights(model_config, model)" in inspect.getsource(DefaultModelLoader.load_weights)


def _vllm_imports(folder: pathlib.Path):
    """(file, module, name or None) of every `import vllm...` and `from vllm... import
    name` in the plug-in's sources."""
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
                for alias in node.names:
                    yield path.name, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("vllm"):
                        yield path.name, alias.name, None


def test_every_vllm_name_the_plugin_imports_exists():
    found = list(_vllm_imports(PLUGIN))
    assert len(found) >= 9, found
    for _file, module, name in found:
        mod = importlib.import_module(module)
        if name is not None and not hasattr(mod, name):
            importlib.import_module(f"{module}.{name}")  # a submodule, else ImportError names it


def test_the_object_storage_bypass_installs_on_034():
    """0.34's try_verify_and_update_config still holds the check the plug-in steps past."""
    from vllm.config.vllm import VllmConfig

    from weightlift.vllm_plugin import _objstore

    assert _objstore.install_bypass()
    wrapper = VllmConfig.try_verify_and_update_config
    assert wrapper.__weightlift_bypass__
    assert _objstore._CHECK_TEXT in inspect.getsource(wrapper.__wrapped__)


# ---- vllm_compat at 0.34's weight_utils -------------------------------------------------------------------------

# vLLM's private helpers vLLM's tests or callers use through weight_utils; its other
# private functions are internals (_mapped_weight_name, ...).
PRIVATE = {"_natural_sort_key", "_shuffle_files", "_get_checkpoints_size_bytes", "_get_fs_type",
           "_prefetch_checkpoint", "_prefetch_all_checkpoints", "_local_snapshot_dirs"}
# Functions imported into 0.34's weight_utils from elsewhere that callers reach through it.
IMPORTED = {"get_available_memory", "copy_weight_", "get_tensor_model_parallel_rank",
            "get_tensor_model_parallel_world_size"}


def _functions(module):
    for name, obj in vars(module).items():
        if not callable(obj) or isinstance(obj, type):
            continue
        own = getattr(obj, "__module__", None) == module.__name__
        if (own and not name.startswith("_")) or name in PRIVATE or name in IMPORTED:
            yield name, obj


def _takes_the_same_calls(theirs, ours) -> list[str]:
    """What of `theirs`' parameters `ours` does not take the same way."""
    t = list(inspect.signature(theirs).parameters.values())
    o = list(inspect.signature(ours).parameters.values())
    problems = []
    positional = [p for p in t if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    ours_positional = [p for p in o if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if [p.name for p in ours_positional[:len(positional)]] != [p.name for p in positional]:
        problems.append(f"positional {[p.name for p in positional]} vs {[p.name for p in ours_positional]}")
    by_name = {p.name: p for p in o}
    var_kw = any(p.kind == p.VAR_KEYWORD for p in o)
    for p in t:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        q = by_name.get(p.name)
        if q is None:
            if not var_kw:
                problems.append(f"no parameter {p.name}")
            continue
        if q.kind == q.POSITIONAL_ONLY and p.kind != p.POSITIONAL_ONLY:
            problems.append(f"{p.name} positional only")
        if p.default is not p.empty and q.default != p.default:
            problems.append(f"{p.name} defaults to {q.default!r}, vLLM's to {p.default!r}")
    names = {p.name for p in t}
    for q in o:  # our own extra parameters must not be needed
        if q.name not in names and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD):
            problems.append(f"extra required parameter {q.name}")
    return problems


@pytest.mark.parametrize("module", ["weight_utils", "ep_weight_filter"])
def test_every_function_of_034_is_in_vllm_compat_and_takes_034s_calls(module):
    theirs = importlib.import_module(f"vllm.model_executor.model_loader.{module}")
    from weightlift import vllm_compat

    functions = dict(_functions(theirs))
    assert len(functions) > (30 if module == "weight_utils" else 3)
    missing = sorted(n for n in functions if not hasattr(vllm_compat, n))
    assert not missing, f"vllm_compat lacks {missing}"
    wrong = {n: p for n, f in functions.items() if (p := _takes_the_same_calls(f, getattr(vllm_compat, n)))}
    assert not wrong, wrong
    if module == "weight_utils":
        tqdm_base = theirs.DisabledTqdm.__mro__[1]
        assert callable(vllm_compat.DisabledTqdm) and issubclass(vllm_compat.DisabledTqdm, tqdm_base)


def _quant_model_config(folder, method, online=None):
    import types

    return types.SimpleNamespace(model=str(folder), quantization=method, quantization_config=online,
                                 hf_config=types.SimpleNamespace(), hf_overrides={}, revision=None)


@pytest.mark.parametrize(("method", "online"), [
    ("fp8_per_tensor", None), ("fp8_per_block", None), ("mxfp8", None), ("mxfp4_hadamard32", None), ("fp8", None),
    ("fp8_per_tensor", "fp8_per_block"), ("mxfp4", "fp8_per_channel"), ("fp8", "fp8_per_block"),
    ("online", "fp8_per_block")])
def test_get_quant_config_for_online_quantization_as_034(tmp_path, method, online):
    """0.34's online quantization without a checkpoint config: a shorthand gives
    OnlineQuantizationConfig of its arguments, the user's merged over them; `fp8` is
    fp8_per_tensor; `online` (and a shorthand's own class) takes the user's arguments."""
    from vllm.config import quantization as q
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import weight_utils as theirs

    from weightlift import vllm_compat as ours

    args = None if online is None else q._ONLINE_SHORTHANDS[online]
    want = theirs.get_quant_config(_quant_model_config(tmp_path, method, args), LoadConfig())
    got = ours.get_quant_config(_quant_model_config(tmp_path, method, args), LoadConfig())
    assert type(got) is type(want) and got.args == want.args

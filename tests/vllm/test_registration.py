"""The plug-in's registration, options and object-storage bypass against the
installed vLLM, and vLLM 0.32's five weight_utils names against vLLM's own
(no engine start: seconds)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import distribution, entry_points

import pytest
import torch


def test_the_entry_point_is_installed_and_registers_the_format():
    eps = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "weightlift"]
    assert [ep.value for ep in eps] == ["weightlift.vllm_plugin:register"]
    # Installed as users install it (the wheel, or pip install of the checkout): the plug-in vLLM
    # imports is the installed distribution's file, not a checkout put on sys.path.
    import weightlift.vllm_plugin

    dist = distribution("weightlift")
    installed = {os.path.realpath(dist.locate_file(f)) for f in dist.files or []}
    assert os.path.realpath(weightlift.vllm_plugin.__file__) in installed, weightlift.vllm_plugin.__file__
    # vLLM's own plug-in loading, as each of its processes runs it, twice (it must be idempotent).
    code = """
import logging
import vllm.logger
vllm.logger._configure_vllm_root_logger()  # as each vLLM process configures its log at start
from vllm.plugins import load_general_plugins
from vllm.model_executor.model_loader import get_model_loader, _LOAD_FORMAT_TO_MODEL_LOADER
from vllm.config.load import LoadConfig
load_general_plugins(); load_general_plugins()
import weightlift.vllm_plugin as p; p.register()
cls = _LOAD_FORMAT_TO_MODEL_LOADER["weightlift"]
loader = get_model_loader(LoadConfig(load_format="weightlift", model_loader_extra_config={"threads": 4}))
handlers = [type(h).__name__ for h in logging.getLogger("weightlift").handlers]
print("RESULT", type(loader).__name__, loader.options.threads, handlers)
logging.getLogger("weightlift.vllm").info("a line from weightlift")
logging.getLogger("weightlift.vllm").debug("not at vLLM's INFO level")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    result = next(line for line in r.stdout.splitlines() if line.startswith("RESULT"))
    assert result.split()[1:3] == ["WeightliftModelLoader", "4"] and "_ToVllmLog" in result
    # weightlift's lines come out through vLLM's handler, in vLLM's format, at vLLM's level.
    assert re.search(r"INFO .* \[<string>:\d+\] a line from weightlift", r.stdout + r.stderr), r.stdout + r.stderr
    assert "not at vLLM's INFO level" not in r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("Registered model loader") == 1


def test_options_are_checked():
    from vllm.config.load import LoadConfig

    from weightlift.vllm_plugin._loader import WeightliftModelLoader

    def make(extra):
        return WeightliftModelLoader(LoadConfig(load_format="weightlift", model_loader_extra_config=extra))

    o = make({"strategy": "stream", "threads": 2, "max_memory": 1 << 28, "direct_io": "off", "distributed": False,
              "into_params": False, "cpus": "all", "enable_weights_track": True}).options
    assert (o.strategy, o.threads, o.max_memory, o.direct_io, o.distributed, o.into_params, o.cpus) == \
        ("stream", 2, 1 << 28, "off", "off", False, "all")
    assert make({}).options.cpus == "node"
    for bad, msg in (({"stratgy": "x"}, "Unexpected extra config keys"), ({"strategy": "fast"}, "strategy must be"),
                     ({"threads": -1}, "threads must be"), ({"direct_io": True}, "direct_io must be"),
                     ({"into_params": "yes"}, "into_params must be"), ({"distributed": "maybe"}, "distributed"),
                     ({"cpus": "some"}, "cpus must be")):
        with pytest.raises(ValueError, match=msg):
            make(bad)
    # DefaultModelLoader still checks its own keys.
    with pytest.raises(ValueError, match="num_threads must be a positive integer"):
        make({"num_threads": 0})


def test_object_storage_bypass_is_narrow_and_fails_loudly(monkeypatch):
    from vllm.config.vllm import VllmConfig

    from weightlift.vllm_plugin import _objstore

    assert _objstore.install_bypass() and _objstore.install_bypass()  # idempotent
    wrapper = VllmConfig.try_verify_and_update_config
    assert wrapper.__weightlift_bypass__
    seen = []

    class Load:
        load_format = "weightlift"

    class Model:
        model_weights = "s3://bucket/model"

    class Fake:
        load_config, model_config = Load(), Model()

    def check(self):  # what vLLM 0.32's check sees
        seen.append(self.load_config.load_format)

    monkeypatch.setattr(wrapper, "__wrapped__", check)
    f = Fake()
    wrapper(f)
    assert seen == ["runai_streamer"] and f.load_config.load_format == "weightlift"
    # Other formats and local models: untouched.
    f.load_config.load_format = "auto"
    wrapper(f)
    f.load_config.load_format, f.model_config.model_weights = "weightlift", ""
    wrapper(f)
    assert seen == ["runai_streamer", "auto", "weightlift"]

    # vLLM rewrites the format during its check: a loud error, the format restored.
    def rewrite(self):
        self.load_config.load_format = "auto"

    monkeypatch.setattr(wrapper, "__wrapped__", rewrite)
    f.model_config.model_weights = "gs://bucket/model"
    with pytest.raises(_objstore.ObjectStorageBypassError, match="vLLM changed the load format"):
        wrapper(f)
    assert f.load_config.load_format == "weightlift"


def test_the_real_check_accepts_weightlift_for_object_storage_only_through_the_bypass():
    """vLLM 0.32 still refuses plug-in formats for object-storage models by itself."""
    from vllm.config.vllm import VllmConfig

    from weightlift.vllm_plugin import _objstore

    _objstore.install_bypass()
    original = VllmConfig.try_verify_and_update_config.__wrapped__
    import inspect

    assert _objstore._CHECK_TEXT in inspect.getsource(original)


def test_vllm_032_names_answer_as_vllms_own(tmp_path):
    """The five names beyond the reference, on the same inputs as vLLM 0.32's own functions."""
    import vllm.model_executor.model_loader.weight_utils as theirs
    from safetensors.torch import save_file
    from vllm.model_executor.models.utils import WeightsMapper

    import weightlift.vllm_compat as ours

    layout = {"model-1.safetensors": ["language_model.a", "language_model.b"],
              "model-2.safetensors": ["language_model.c", "visual.d"], "model-3.safetensors": ["visual.e"]}
    files = []
    for f, names in layout.items():
        save_file({n: torch.zeros(2) for n in names}, tmp_path / f)
        files.append(str(tmp_path / f))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, names in layout.items() for n in names}}))
    for unused in (lambda n: n.startswith("visual."), lambda n: True, lambda n: n.startswith("language_model.")):
        assert ours.filter_safetensors_files_by_weight_name(files, unused) == \
            theirs.filter_safetensors_files_by_weight_name(files, unused)
    mappers = [None, WeightsMapper(orig_to_new_prefix={"model.visual.": "visual."}),
               WeightsMapper(orig_to_new_prefix={"model.vision_backbone.": "vision_backbone.", "model.": "model."})]
    for names in (None, [], ["language_model"], ["model"], ["language_model.", "lm_head"]):
        for m in mappers:
            assert ours.resolve_mm_encoder_only_lm_prefixes(names, weights_mapper=m) == \
                theirs.resolve_mm_encoder_only_lm_prefixes(names, weights_mapper=m), (names, m)
    for prefixes in (("language_model.",), ("visual.",), ()):
        for m in mappers[:2]:
            args = (files, str(tmp_path), "model.safetensors.index.json", prefixes)
            assert ours.filter_mm_encoder_only_safetensors_files(*args, weights_mapper=m) == \
                theirs.filter_mm_encoder_only_safetensors_files(*args, weights_mapper=m)
    assert issubclass(ours.DisabledTqdm, theirs.tqdm) and ours.DisabledTqdm(range(2), disable=False).disable


def test_object_storage_configs_without_runai(s3_model, tmp_path):
    """Where runai-model-streamer is not installed, vLLM's ModelConfig still gets an object-storage
    model's configs: the plug-in's pull_files (weightlift's S3 client) stands in for runai's, and
    pulls exactly what runai's pulls."""
    url, env = s3_model
    e = dict(os.environ, **env, RUNAI_STREAMER_S3_ENDPOINT=env["AWS_ENDPOINT_URL"])
    # Both pulls, with both of vLLM's pattern sets, in one process (each interpreter start costs seconds).
    pulls, calls = [], []
    for allow, ignore in ((["*.model", "*.py", "*.json"], None),
                          (None, ["*.pt", "*.safetensors", "*.bin", "*.tensors", "*.pth"])):
        theirs, ours = tmp_path / f"runai-{len(allow or [])}", tmp_path / f"ours-{len(allow or [])}"
        pulls.append((theirs, ours))
        calls += [f"runai({url!r}, {str(theirs)!r}, {allow!r}, {ignore!r})",
                  f"ours({url!r}, {str(ours)!r}, {allow!r}, {ignore!r})"]
    code = "; ".join(["from runai_model_streamer import pull_files as runai",
                      "from weightlift.vllm_plugin._objstore import pull_files as ours", *calls])
    r = subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for theirs, ours in pulls:
        listing = lambda d: sorted((str(p.relative_to(d)), p.read_bytes()) for p in d.rglob("*") if p.is_file())  # noqa: E731
        assert listing(ours) == listing(theirs) and listing(ours)
    # vLLM itself, runai hidden: ModelConfig pulls the configs through the plug-in.
    code = f"""
import sys
sys.modules["runai_model_streamer"] = None
import vllm.logger
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config import ModelConfig
mc = ModelConfig(model={url!r}, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256)
print("RESULT", mc.model_weights, mc.architecture, *sorted(__import__("os").listdir(mc.model)))
"""
    r = subprocess.run([sys.executable, "-c", code], env=dict(e, VLLM_ASSETS_CACHE=str(tmp_path / "assets")),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    result = next(line for line in r.stdout.splitlines() if line.startswith("RESULT"))
    assert result.split()[1:] == [url, "LlamaForCausalLM", "config.json", "model.safetensors.index.json"]


def test_object_storage_weights_are_chosen_with_the_index(s3_model, model):
    """An s3:// prefix is chosen from as vLLM chooses from a folder: a safetensors file the index does not
    name (a consolidated copy beside the shards) is left out, naturally ordered; an index that names a
    missing shard is an error naming it (the engine's index rule, read through its S3 source)."""
    import boto3
    from botocore.config import Config

    url, env = s3_model
    c = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                     config=Config(s3={"addressing_style": "path"}))
    shards = sorted(p.name for p in model.glob("*.safetensors"))
    index = json.loads((model / "model.safetensors.index.json").read_text())
    for prefix, names in (("dup", shards), ("missing", shards[1:])):
        for n in names:
            c.upload_file(str(model / n), "models", f"{prefix}/{n}")
        c.upload_file(str(model / shards[0]), "models", f"{prefix}/consolidated.safetensors")
        c.put_object(Bucket="models", Key=f"{prefix}/model.safetensors.index.json", Body=json.dumps(index).encode())
    code = """
import json, sys
from vllm.config.load import LoadConfig
from weightlift.vllm_plugin._loader import WeightliftModelLoader
loader = WeightliftModelLoader(LoadConfig(load_format="weightlift"))
folder, files, st, _ = loader._prepare_weights("s3://models/dup", None, None, True, None)
print("FILES", json.dumps([folder, files, st]))
try:
    loader._prepare_weights("s3://models/missing/", None, None, True, None)
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.splitlines()
    folder, files, st = json.loads(next(line for line in out if line.startswith("FILES"))[6:])
    assert (folder, st) == ("s3://models/dup", True)
    # The shards the index names, naturally ordered: no consolidated.safetensors, and not the fixture's
    # shard that held only the untied lm_head (dropped from the index when the embeddings were tied).
    named = sorted(set(index["weight_map"].values()))
    assert named != shards and files == [f"s3://models/dup/{n}" for n in named]
    err = next(line for line in out if line.startswith("ERROR"))
    assert "FileNotFoundError" in err and shards[0] in err and "does not exist" in err, err

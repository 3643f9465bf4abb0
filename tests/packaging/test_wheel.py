"""The binary wheels of scripts/wheel: manylinux as auditwheel sees it, every
library they need either in the manylinux base set or inside, CUDA and MPI
never inside, and, installed into a fresh venv without a build step, the CLI
and the module load a synthesized model with the build tree's checksums."""
import configparser
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from wheels import PYPROJECT, ROOT, WHEELS, wheel_tags

pytestmark = pytest.mark.skipif(not WHEELS, reason="no wheel in dist/ (scripts/wheel builds them)")

# Libraries the package loads only with dlopen() when present, never bundled nor needed.
RUNTIME_ONLY = re.compile(r"lib(cuda|cudart|nvrtc|cufile|nccl|mpi|mpich|open-rte|open-pal)[.-]")
DEBIAN_GLIBC = (2, 36)


def manylinux_policy(tag):
    import auditwheel

    policies = json.loads((pathlib.Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json").read_text())
    name = re.sub(r"_x86_64$", "", tag)
    return next(p for p in policies if p["name"] == name or name in p["aliases"])


def elf_files(wheel):
    """{path in the wheel: (NEEDED, RPATH/RUNPATH entries)} of every ELF file of the wheel."""
    out = {}
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            data = z.read(info)
            if not data.startswith(b"\x7fELF"):
                continue
            elf = ELFFile(io.BytesIO(data))
            needed, rpaths = [], []
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    for t in sec.iter_tags():
                        if t.entry.d_tag == "DT_NEEDED":
                            needed.append(t.needed)
                        elif t.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                            rpaths += getattr(t, "rpath", getattr(t, "runpath", "")).split(":")
            out[info.filename] = (needed, rpaths)
    return out


def test_auditwheel_accepts_the_manylinux_tag(wheel):
    plat = wheel_tags(wheel)[2]
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", plat)
    assert m, f"{wheel.name} is not tagged manylinux_X_Y_x86_64"
    assert (int(m.group(1)), int(m.group(2))) <= DEBIAN_GLIBC, f"{plat} needs a newer glibc than Debian 12's 2.36"
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    shown = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    assert shown, text
    assert shown.group(1) == plat, text


def test_every_needed_library_is_in_the_base_set_or_inside(wheel):
    files = elf_files(wheel)
    # The policy's libraries, and the dynamic loader itself (glibc's, as auditwheel counts it).
    base = set(manylinux_policy(wheel_tags(wheel)[2])["lib_whitelist"]) | {"ld-linux-x86-64.so.2"}
    assert any(f.startswith("weightlift/_core") for f in files)
    names = {pathlib.PurePosixPath(f) for f in files}
    for f, (needed, rpaths) in files.items():
        here = pathlib.PurePosixPath(f).parent
        dirs = [here] + [pathlib.PurePosixPath(os.path.normpath(str(here / r.replace("$ORIGIN", ".")))) for r in rpaths
                         if r.startswith("$ORIGIN")]
        for lib in needed:
            assert not RUNTIME_ONLY.match(lib), f"{f} needs {lib}, which must stay optional (dlopen at run time)"
            if lib in base:
                continue
            assert any(d / lib in names for d in dirs), f"{f} needs {lib}: not in the manylinux base set nor inside"


def test_cuda_and_mpi_are_not_bundled(wheel):
    with zipfile.ZipFile(wheel) as z:
        inside = [pathlib.PurePosixPath(n).name for n in z.namelist()]
    bundled = [n for n in inside if RUNTIME_ONLY.match(n)]
    assert not bundled, f"{wheel.name} carries {bundled}: CUDA, NCCL, cuFile and MPI are loaded from the system"


def test_the_wheel_carries_cli_module_plugins_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        ep_file = f"{dist_info}/entry_points.txt"
        entry_points = z.read(ep_file).decode() if ep_file in names else ""
        metadata = z.read(f"{dist_info}/METADATA").decode()
    assert "weightlift/weightlift-cli" in names
    # An abi3 wheel holds a stable-ABI module (nanobind's STABLE_ABI), not one Python's.
    if wheel_tags(wheel)[1] == "abi3":
        assert "weightlift/_core.abi3.so" in names, sorted(n for n in names if "_core" in n)
    script = f"weightlift-{PYPROJECT['project']['version']}.data/scripts/weightlift"
    assert script in names, "the `weightlift` command"
    for py in (ROOT / "python" / "weightlift").rglob("*.py"):
        assert f"weightlift/{py.relative_to(ROOT / 'python' / 'weightlift').as_posix()}" in names
    # Built here whenever the toolkit / MPI is: then the wheel carries them.
    if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):
        assert "weightlift/libweightlift_cuda.so" in names
    if shutil.which("mpicc"):
        assert "weightlift/libweightlift_mpi.so" in names
    # Every entry point pyproject.toml declares is in the wheel's metadata.
    declared = dict(PYPROJECT["project"].get("entry-points", {}))
    if "scripts" in PYPROJECT["project"]:
        declared["console_scripts"] = PYPROJECT["project"]["scripts"]
    ep = configparser.ConfigParser()
    ep.optionxform = str
    ep.read_string(entry_points)
    for group, entries in declared.items():
        for name, target in entries.items():
            assert ep.has_option(group, name) and ep.get(group, name).strip() == target, f"[{group}] {name} = {target}"
    for dep in PYPROJECT["project"]["dependencies"]:
        assert f"Requires-Dist: {dep}" in metadata


def test_pip_installs_it_without_building(venv):
    log = venv.install_log
    assert "Successfully installed weightlift" in log, log
    assert not re.search(r"Building wheel|Running setup\.py|Preparing metadata", log), log
    assert venv.install_seconds < 60, f"pip install took {venv.install_seconds:.0f} s"
    site = venv.site_package()
    for f in ("weightlift-cli", "__init__.py"):
        assert (site / f).exists()
    assert next(site.glob("_core*.so"))


def test_the_command_loads_with_the_build_trees_checksums(venv, model):
    out = venv.run(venv.weightlift, "load", model["dir"], "--checksum", "--format", "jsonl", "--no-progress").stdout
    assert out == model["jsonl"]
    usage = venv.run(venv.weightlift, "synth", "--help").stdout
    assert "Usage: weightlift synth" in usage


def test_the_command_synthesizes_the_same_model(venv, model, tmp_path):
    venv.run(venv.weightlift, "synth", tmp_path / "m", "--size", "TINY", "--shards", "2")
    out = venv.run(venv.weightlift, "load", tmp_path / "m", "--checksum", "--format", "jsonl", "--no-progress").stdout
    assert out == model["jsonl"]


MODULE_CHECKSUMS = r"""
import hashlib, json, sys
import torch
import weightlift
files = sorted(str(p) for p in __import__("pathlib").Path(sys.argv[1]).glob("*.safetensors"))
out = {}
for name, t in weightlift.safetensors_weights_iterator(files, False):
    out[name] = hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
print(json.dumps({"file": weightlift.__file__, "sha256": out}))
"""

# Without torch (a Python for which this machine has none: the abi3 wheel's),
# the extension itself, by its stream of tensors: each tensor's bytes as a
# buffer, or, from the stable-ABI module, as a DLPack capsule read with ctypes.
CORE_CHECKSUMS = r"""
import ctypes, hashlib, importlib.util, json, sys, pathlib
from importlib.machinery import ExtensionFileLoader

class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]

get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

def raw(data):
    try:
        return bytes(memoryview(data).cast("B"))
    except TypeError:
        t = DLTensor.from_address(get_pointer(data, b"dltensor"))
        assert t.ndim == 1 and t.bits == 8 and t.device_type == 1, (t.ndim, t.bits, t.device_type)
        return ctypes.string_at(t.data + t.byte_offset, t.shape[0]) if t.shape[0] else b""

spec = importlib.util.find_spec("weightlift")
path = next(pathlib.Path(spec.submodule_search_locations[0]).glob("_core*.so"))
loader = ExtensionFileLoader("weightlift._core", str(path))
core = loader.create_module(importlib.util.spec_from_file_location("weightlift._core", path, loader=loader))
files = sorted(str(p) for p in pathlib.Path(sys.argv[1]).glob("*.safetensors"))
out = {}
for name, _file, _dtype, _shape, data in core.Stream(files, core.LoadOptions()):
    out[name] = hashlib.sha256(raw(data)).hexdigest()
print(json.dumps({"file": str(path), "sha256": out}))
"""


def test_the_module_loads_with_the_build_trees_checksums(venv, model):
    has_torch = venv.run(venv.python, "-c", "import torch", check=False).returncode == 0
    script = MODULE_CHECKSUMS if has_torch else CORE_CHECKSUMS
    got = json.loads(venv.run(venv.python, "-c", script, model["dir"], cwd="/").stdout)
    assert pathlib.Path(got["file"]).is_relative_to(venv.path), got["file"]
    assert got["sha256"] == model["sha256"]


def test_the_optional_libraries_load_from_the_package(venv):
    site = venv.site_package()
    for lib in ("libweightlift_cuda.so", "libweightlift_mpi.so"):
        if not (site / lib).exists():
            continue
        # Loadable as they are: nothing they need is missing (MPI's symbols
        # resolve against libmpi, which the package loads first: RTLD_LAZY here).
        code = f"import ctypes, os; ctypes.CDLL({str(site / lib)!r}, mode=os.RTLD_LAZY)"
        if lib == "libweightlift_mpi.so":
            if not shutil.which("mpirun"):
                continue
            code = "import ctypes, os; ctypes.CDLL('libmpi.so.40', mode=os.RTLD_GLOBAL); " + code.split("; ", 1)[1]
        venv.run(venv.python, "-c", code)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (scripts/setup installs openmpi-bin)")
def test_the_command_runs_under_mpirun_with_the_systems_mpi(venv, model, tmp_path):
    if not (venv.site_package() / "libweightlift_mpi.so").exists():
        pytest.skip("this wheel was built without MPI")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_mpi_yield_when_idle="1")
    outdir = tmp_path / "mpi"
    r = venv.run("mpirun", "--oversubscribe", "-np", "2", "--output-filename", outdir, venv.weightlift, "load",
                 model["dir"], "--distributed", "--checksum", "--format", "jsonl", "--no-progress",
                 env=env, timeout=300)
    for rank in range(2):
        assert (outdir / "1" / f"rank.{rank}" / "stdout").read_text() == model["jsonl"], r.stdout + r.stderr

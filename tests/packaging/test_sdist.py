"""The sdist: it carries what a source build needs and nothing of a build tree,
it configures as pip's build would, and a machine missing system packages gets
one message naming them (Debian's names), not a CMake trace."""
import os
import re
import subprocess
import sys
import tarfile

import pytest
from wheels import ROOT, VERSION


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdist")
    code = "import sys; from scikit_build_core.build import build_sdist; build_sdist(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, check=True, capture_output=True)
    path = out / f"weightlift-{VERSION}.tar.gz"
    assert path.exists(), list(out.iterdir())
    return path


def configure(src, build, *defines, env=None):
    args = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", f"-DPython_EXECUTABLE={sys.executable}",
            "-DWEIGHTLIFT_PYTHON=ON", "-DWEIGHTLIFT_BUILD_TESTS=OFF", "-DWEIGHTLIFT_BUILD_BENCH=OFF",
            "-DWEIGHTLIFT_CUDA=OFF",
            *defines]
    return subprocess.run(args, capture_output=True, text=True, env=dict(os.environ, **(env or {})), timeout=600)


def test_the_sdist_carries_the_sources_and_no_build_tree(sdist):
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ("pyproject.toml", "CMakeLists.txt", "cmake/Dependencies.cmake", "python/CMakeLists.txt",
                 "python/scripts/weightlift", "python/weightlift/__init__.py", "src/cuda/CMakeLists.txt",
                 "src/dist/mpi/CMakeLists.txt", "tools/main.cpp", "include/weightlift/status.h"):
        assert need in names, need
    for src in (ROOT / "src").rglob("*.cpp"):
        assert src.relative_to(ROOT).as_posix() in names
    leftovers = sorted(n for n in names if re.match(r"(build[^/]*|\.venv|dist|\.git)/", n))
    assert not leftovers, leftovers[:10]


def test_the_sdist_configures_like_pips_build(sdist, tmp_path):
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path)  # our own sdist, just built
    r = configure(tmp_path / f"weightlift-{VERSION}", tmp_path / "build")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Configuring done" in r.stdout


# What each missing piece is reported as: every find of cmake/Dependencies.cmake fails.
MISSING = ["nlohmann-json3-dev", "libfmt-dev", "libssl-dev", "libcurl4-openssl-dev", "pkg-config", "libre2-dev",
           "libtinyxml2-dev", "libisal-dev", "libcli11-dev", "python3-dev"]


def test_missing_system_packages_are_named_in_one_message(tmp_path):
    hide = [f"-DCMAKE_DISABLE_FIND_PACKAGE_{p}=ON" for p in ("nlohmann_json", "fmt", "OpenSSL", "CURL", "PkgConfig",
                                                             "CLI11", "Python")]
    r = configure(ROOT, tmp_path / "build", *hide, "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local")
    assert r.returncode != 0
    assert r.stderr.count("CMake Error") == 1, r.stderr
    line = next((ln for ln in r.stderr.splitlines() if "apt-get install" in ln), "")
    assert line.split("apt-get install", 1)[1].split() == MISSING, r.stderr


def test_one_missing_package_is_named_alone(tmp_path):
    r = configure(ROOT, tmp_path / "build", env={"PKG_CONFIG_LIBDIR": str(tmp_path / "none")})
    assert r.returncode != 0
    assert r.stderr.count("CMake Error") == 1, r.stderr
    line = next((ln for ln in r.stderr.splitlines() if "apt-get install" in ln), "")
    assert line.split("apt-get install", 1)[1].split() == ["libre2-dev", "libtinyxml2-dev", "libisal-dev"], r.stderr

#!/usr/bin/env bash
# Builds, on this (CPU) machine, everything bench/gpu/run.sh needs on a device
# machine as it is (not Debian 12; Python 3.12 with its own torch), into
# build-gpu/ (under the 64 MiB a device run may carry):
#   weightlift, gpu_h2d_bench        the CLI and the H2D probe (stripped)
#   lib/                             the shared libraries they and _core need
#                                    beyond glibc, libstdc++ and libgcc_s (ldd),
#                                    on a private path (run.sh sets LD_LIBRARY_PATH)
#   libweightlift_cuda.so            the kernels (dummy weights) and a static runtime
#   libcudart.so.13                  a fallback runtime, when the toolkit has it
#   py/                              the package for CPython 3.12 (weightlift/ with
#                                    _core, plus tqdm and filelock), on PYTHONPATH
# The cp312 package: scripts/wheel's cp312-abi3 wheel when that script exists
# (it bundles _core's libraries itself); otherwise built here with a Python
# 3.12 (python3.12 on PATH or pyenv's, PY312=... to choose) in its own venv
# (build-py312-venv/: scikit-build-core, nanobind, tqdm, filelock from PyPI).
#
#   bench/gpu/prepare.sh
#   then on the device machine (carry ["build-gpu"]):  bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=$root/build-gpu

scripts/build >/dev/null
rm -rf "$out" && mkdir -p "$out/lib" "$out/py"
cp build/bin/weightlift build/bin/gpu_h2d_bench "$out/"
strip "$out/weightlift" "$out/gpu_h2d_bench"
if [ -f build/lib/libweightlift_cuda.so ]; then cp build/lib/libweightlift_cuda.so "$out/"; fi
if [ -f /usr/local/cuda/lib64/libcudart.so.13 ]; then cp -L /usr/local/cuda/lib64/libcudart.so.13 "$out/"; fi

# ---- the cp312 package ---------------------------------------------------------------------------
py312=${PY312:-}
if [ -z "$py312" ]; then
  for cand in python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      py312=$(command -v "$cand"); break
    fi
  done
fi
[ -n "$py312" ] || { echo "prepare.sh: no Python 3.12 found (set PY312=/path/to/python3.12)" >&2; exit 1; }
venv=$root/build-py312-venv
[ -x "$venv/bin/python" ] || "$py312" -m venv "$venv"
"$venv/bin/python" -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" tqdm filelock cmake ninja >/dev/null
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
if [ -x scripts/wheel ]; then
  # Helper "wheel"'s output: a manylinux cp312-abi3 wheel with its libraries inside.
  scripts/wheel --python "$venv/bin/python" >&2
  whl=$(find dist -name 'weightlift-*-cp312-abi3-*.whl' | sort | tail -1)
else
  PATH=$venv/bin:$PATH "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$wheels" . >&2
  whl=$(find "$wheels" -name 'weightlift-*.whl' | head -1)
fi
[ -n "$whl" ] || { echo "prepare.sh: no cp312 wheel was built" >&2; exit 1; }
"$venv/bin/python" -m zipfile -e "$whl" "$out/py"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cp -r "$site/tqdm" "$site/filelock" "$out/py/"

# ---- the shared libraries ldd lists beyond the base system ---------------------------------------
base='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.'
for bin in "$out/weightlift" "$out/gpu_h2d_bench" $(find "$out/py/weightlift" -name '_core*.so'); do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $base ]] && [ ! -e "$out/lib/$name" ] && [ ! -e "$out/py/weightlift.libs/$name" ]; then
      cp -L "$path" "$out/lib/$name"
    fi
  done
done
# Every library found? (on this machine, with only the private path)
missing=$(LD_LIBRARY_PATH=$out/lib ldd "$out/weightlift" | grep -c 'not found' || true)
[ "$missing" = 0 ] || { echo "prepare.sh: libraries not found for the CLI" >&2; exit 1; }
size=$(du -sm "$out" | cut -f1)
echo "build-gpu: ${size} MiB ($(find "$out/lib" -type f | wc -l) libraries, python package $(basename "$whl"))"
[ "$size" -lt 64 ] || { echo "prepare.sh: build-gpu is ${size} MiB, over the 64 MiB a device run carries" >&2; exit 1; }

#!/usr/bin/env bash
# Builds, on this (CPU) machine, what bench/gpu/run.sh needs on a machine
# with a GPU, into build-gpu/ (about 10 MiB, well under the 64 MiB a device
# run may carry): the CLI, the H2D probe, libweightlift_cuda.so (the dummy
# kernel plus a static CUDA runtime) and, when the toolkit has it,
# libcudart.so.13 as a fallback runtime.
#   bench/gpu/prepare.sh
#   then, on the device machine, with carry ["build-gpu"]:  bench/gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build >/dev/null
rm -rf build-gpu && mkdir -p build-gpu
cp build/bin/weightlift build/bin/gpu_h2d_bench build-gpu/
strip build-gpu/weightlift build-gpu/gpu_h2d_bench
if [ -f build/lib/libweightlift_cuda.so ]; then cp build/lib/libweightlift_cuda.so build-gpu/; fi
if [ -f /usr/local/cuda/lib64/libcudart.so.13 ]; then cp -L /usr/local/cuda/lib64/libcudart.so.13 build-gpu/; fi
du -sh build-gpu

// libweightlift_cuda.so: the GPU side of weightlift (see src/model/cuda_abi.h).
// Device memory handles (alloc/release) and the dummy-weight kernel, which
// uses the same Philox and conversions as the CPU fill (model/dummy_math.h).
#include <cuda_runtime.h>

#include <cstdio>

#include "model/cuda_abi.h"

namespace {

using wl::dummy::Params;

int report(cudaError_t e, const char* what, char* err, size_t errlen) {
  if (e == cudaSuccess) return 0;
  if (err && errlen) std::snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
  return static_cast<int>(e);
}

__global__ void fill_dummy_kernel(int kind, unsigned char* out, uint64_t numel, Params p) {
  const uint64_t per = kind == wl::dummy::kF64 ? 2 : 4;  // elements per Philox block
  const uint64_t blocks = (numel + per - 1) / per;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t b = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    wl::dummy::U4 w = wl::dummy::philox4x32(b, p.seed);
    const uint64_t first = b * per;
    if (kind == wl::dummy::kF64) {
      for (uint64_t j = 0; j < 2 && first + j < numel; ++j) {
        double v = wl::dummy::uniform_f64(w.v[2 * j], w.v[2 * j + 1], p.low64, p.range64);
        if (!(v < p.high64)) v = p.low64;
        reinterpret_cast<double*>(out)[first + j] = v;
      }
      continue;
    }
    for (uint64_t j = 0; j < 4 && first + j < numel; ++j) {
      uint32_t bits = wl::dummy::element_from_word(kind, w.v[j], p);
      switch (kind) {
        case wl::dummy::kF32: reinterpret_cast<uint32_t*>(out)[first + j] = bits; break;
        case wl::dummy::kF16:
        case wl::dummy::kBF16: reinterpret_cast<uint16_t*>(out)[first + j] = static_cast<uint16_t>(bits); break;
        default: out[first + j] = static_cast<unsigned char>(bits); break;
      }
    }
  }
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

int alloc(int device, size_t bytes, void** out, char* err, size_t errlen) {
  if (int rc = report(cudaSetDevice(device), "cudaSetDevice", err, errlen)) return rc;
  return report(cudaMalloc(out, bytes), "cudaMalloc", err, errlen);
}

int release(int device, void* ptr) {
  if (cudaSetDevice(device) != cudaSuccess) return 1;
  return static_cast<int>(cudaFree(ptr));
}

int copy_to_host(int device, void* dst, const void* src, size_t bytes, char* err, size_t errlen) {
  if (int rc = report(cudaSetDevice(device), "cudaSetDevice", err, errlen)) return rc;
  return report(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host", err, errlen);
}

int copy_to_device(int device, void* dst, const void* src, size_t bytes, char* err, size_t errlen) {
  if (int rc = report(cudaSetDevice(device), "cudaSetDevice", err, errlen)) return rc;
  return report(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device", err, errlen);
}

int fill_dummy(int device, int kind, void* ptr, uint64_t numel, const Params* params, char* err, size_t errlen) {
  if (numel == 0) return 0;
  if (int rc = report(cudaSetDevice(device), "cudaSetDevice", err, errlen)) return rc;
  const uint64_t per = kind == wl::dummy::kF64 ? 2 : 4;
  const uint64_t blocks = (numel + per - 1) / per;
  const int threads = 256;
  uint64_t grid = (blocks + threads - 1) / threads;
  if (grid > 65535ull * 16) grid = 65535ull * 16;  // grid-stride loop covers the rest
  fill_dummy_kernel<<<static_cast<unsigned>(grid), threads>>>(kind, static_cast<unsigned char*>(ptr), numel, *params);
  if (int rc = report(cudaGetLastError(), "dummy-weight kernel launch", err, errlen)) return rc;
  return report(cudaDeviceSynchronize(), "dummy-weight kernel", err, errlen);
}

const WlCudaApi kApi = {kWlCudaAbiVersion, device_count, alloc, release, copy_to_host, copy_to_device, fill_dummy};

}  // namespace

extern "C" __attribute__((visibility("default"))) const WlCudaApi* wl_cuda_api(void) { return &kApi; }

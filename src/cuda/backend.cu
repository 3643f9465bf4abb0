// libweightlift_cuda.so: the GPU side of weightlift (see src/gpu/cuda_abi.h).
// The dummy-weight kernel, which uses the same Philox and conversions as the
// CPU fill (weightlift/dummy_kernel.h), and the entry points of the CUDA runtime it
// links statically: the loader (src/gpu/loader.cpp) takes its runtime table
// from here when the process has no libcudart already loaded.
#include <cuda_runtime.h>

#include <cstdio>

#include "gpu/cuda_abi.h"

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

int rc(cudaError_t e) { return static_cast<int>(e); }
cudaStream_t st(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t ev(void* e) { return static_cast<cudaEvent_t>(e); }

const WlCudaApi kApi = {
    kWlCudaAbiVersion,
    {
        [](int* n) { return rc(cudaGetDeviceCount(n)); },
        [](int d) { return rc(cudaSetDevice(d)); },
        [](int* d) { return rc(cudaGetDevice(d)); },
        [](void** p, size_t n) { return rc(cudaMalloc(p, n)); },
        [](void* p) { return rc(cudaFree(p)); },
        [](void** p, size_t n, unsigned f) { return rc(cudaHostAlloc(p, n, f)); },
        [](void* p) { return rc(cudaFreeHost(p)); },
        [](void* d, const void* s, size_t n, int k) { return rc(cudaMemcpy(d, s, n, static_cast<cudaMemcpyKind>(k))); },
        [](void* d, const void* s, size_t n, int k, void* stream) {
          return rc(cudaMemcpyAsync(d, s, n, static_cast<cudaMemcpyKind>(k), st(stream)));
        },
        [](void** s, unsigned f) { return rc(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(s), f)); },
        [](void* s) { return rc(cudaStreamDestroy(st(s))); },
        [](void* s) { return rc(cudaStreamSynchronize(st(s))); },
        [](void** e, unsigned f) { return rc(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(e), f)); },
        [](void* e) { return rc(cudaEventDestroy(ev(e))); },
        [](void* e, void* s) { return rc(cudaEventRecord(ev(e), st(s))); },
        [](void* e) { return rc(cudaEventSynchronize(ev(e))); },
        [](void* e) { return rc(cudaEventQuery(ev(e))); },
        [](size_t* f, size_t* t) { return rc(cudaMemGetInfo(f, t)); },
        [](int* v) { return rc(cudaRuntimeGetVersion(v)); },
        [] { return rc(cudaGetLastError()); },
        [](int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); },
        [](void* p, size_t n, unsigned f) { return rc(cudaHostRegister(p, n, f)); },
        [](void* p) { return rc(cudaHostUnregister(p)); },
        [](int* v, int a, int d) { return rc(cudaDeviceGetAttribute(v, static_cast<cudaDeviceAttr>(a), d)); },
    },
    fill_dummy,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const WlCudaApi* wl_cuda_api(void) { return &kApi; }

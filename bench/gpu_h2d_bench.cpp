// gpu_h2d_bench [DEVICE] [MIB]: this machine's pinned host-to-device copy
// bandwidth, the limit the GPU destination is measured against
// (bench/gpu/run.sh). Copies MIB MiB of pinned memory to cuda:DEVICE with
// cudaMemcpyAsync in 8 MiB pieces on two streams, as the staging ring does,
// and as one copy; prints the best of 5 runs of each, in GB/s (1e9 B/s).
// Runs on the backend weightlift would use (WEIGHTLIFT_GPU_BACKEND=fake: the
// host fake, a memcpy figure).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu/api.h"

using namespace wl::gpu;

int main(int argc, char** argv) {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  const uint64_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const uint64_t n = mib << 20, piece = uint64_t{8} << 20;
  const Api& a = backend().api();
  if (wl::Status s = set_device(a, device); !s.ok()) {
    std::fprintf(stderr, "gpu_h2d_bench: %s\n", s.to_string().c_str());
    return 1;
  }
  void *host = nullptr, *dev = nullptr, *streams[2] = {nullptr, nullptr}, *done[2] = {nullptr, nullptr};
  auto check = [&](int rc, const char* what) {
    if (rc == 0) return;
    std::fprintf(stderr, "gpu_h2d_bench: %s\n", cuda_error(a, rc, what).to_string().c_str());
    std::exit(1);
  };
  check(a.rt.hostAlloc(&host, n, kCudaHostAllocPortable), "cudaHostAlloc");
  check(a.rt.malloc(&dev, n), "cudaMalloc");
  for (int i = 0; i < 2; ++i) {
    check(a.rt.streamCreateWithFlags(&streams[i], kCudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    check(a.rt.eventCreateWithFlags(&done[i], kCudaEventDisableTiming), "cudaEventCreateWithFlags");
  }
  for (uint64_t i = 0; i < n; i += 4096) static_cast<char*>(host)[i] = static_cast<char>(i);  // fault it in
  auto run = [&](uint64_t step) {
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      int k = 0;
      for (uint64_t off = 0; off < n; off += step, ++k) {
        uint64_t len = std::min(step, n - off);
        check(a.rt.memcpyAsync(static_cast<char*>(dev) + off, static_cast<char*>(host) + off, len,
                               kCudaMemcpyHostToDevice, streams[k % 2]),
              "cudaMemcpyAsync");
      }
      for (int i = 0; i < 2; ++i) {
        check(a.rt.eventRecord(done[i], streams[i]), "cudaEventRecord");
        check(a.rt.eventSynchronize(done[i]), "cudaEventSynchronize");
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(n) / s / 1e9);
    }
    return best;
  };
  double pieces = run(piece), whole = run(n);
  std::printf("pinned H2D to cuda:%d on %s: %.2f GB/s in 8 MiB pieces on 2 streams, %.2f GB/s as one copy (%llu MiB)\n",
              device, a.name.c_str(), pieces, whole, static_cast<unsigned long long>(mib));
  for (int i = 0; i < 2; ++i) {
    (void)a.rt.eventDestroy(done[i]);
    (void)a.rt.streamDestroy(streams[i]);
  }
  (void)a.rt.free(dev);
  (void)a.rt.freeHost(host);
  return 0;
}

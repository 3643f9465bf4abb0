// Benchmark helper: opens PyTorch checkpoints with weightlift and materializes
// every tensor as an owned, row-major buffer (what torch.load returns), keeping
// them all alive until the end. Prints one JSON line: seconds, bytes, tensors.
// Built by bench/torch/run_torch_bench against build/lib/libweightlift.a.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "weightlift/torch.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: materialize [--threads N] FILE...\n");
    return 2;
  }
  int threads = 2;
  bool views = false;  // --mode view: zero-copy views of a populated mapping, every page touched
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (a == "--mode" && i + 1 < argc)
      views = std::string(argv[++i]) == "view";
    else
      files.push_back(a);
  }
  auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0, count = 0;
  std::vector<std::vector<wl::Tensor>> kept;
  std::vector<std::vector<wl::TensorView>> kept_views;
  std::atomic<uint64_t> checksum{0};
  for (auto& f : files) {
    auto ck = wl::TorchCheckpoint::open(f, wl::Env::Default(), {.populate = views});
    if (!ck.ok()) {
      std::fprintf(stderr, "weightlift: error: %s\n", ck.status().to_string().c_str());
      return 1;
    }
    const size_t n = (*ck)->tensors().size();
    kept.emplace_back(n);
    kept_views.emplace_back(n);
    auto& out = kept.back();
    auto& out_views = kept_views.back();
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    // Tensors that are the same view of the same storage (tied weights) are materialized once,
    // as torch.load does.
    std::vector<size_t> same(n);
    std::map<std::tuple<size_t, uint64_t, wl::Shape, std::vector<int64_t>>, size_t> first;
    for (size_t i = 0; i < n; ++i) {
      auto& t = (*ck)->strided()[i];
      same[i] = first.emplace(std::make_tuple(t.storage, t.storage_offset, t.sizes, t.strides), i).first->second;
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        for (size_t i; (i = next++) < n;) {
          if (same[i] != i) continue;
          if (views) {
            auto v = (*ck)->view(i);
            if (!v.ok()) {
              std::fprintf(stderr, "weightlift: error: %s\n", v.status().to_string().c_str());
              failed = true;
              return;
            }
            uint64_t sum = 0;  // fault every page in
            for (size_t off = 0; off < v->nbytes(); off += 4096) sum += static_cast<uint64_t>(v->data()[off]);
            checksum += sum;
            out_views[i] = std::move(*v);
            continue;
          }
          auto r = (*ck)->read(i);
          if (!r.ok()) {
            std::fprintf(stderr, "weightlift: error: %s\n", r.status().to_string().c_str());
            failed = true;
            return;
          }
          out[i] = std::move(*r);
        }
      });
    for (auto& t : pool) t.join();
    if (failed) return 1;
    for (auto& t : out) bytes += t.nbytes();
    for (auto& v : out_views) bytes += v.nbytes();
    count += n;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"seconds\": %.6f, \"bytes\": %llu, \"tensors\": %llu}\n", s, static_cast<unsigned long long>(bytes),
              static_cast<unsigned long long>(count));
  return 0;
}

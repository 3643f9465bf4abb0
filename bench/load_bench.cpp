// Load benchmark (issue 2): every strategy on a synthesized multi-GB
// checkpoint, hot and cold page cache, next to this machine's limits measured
// in the same run: single-thread memcpy bandwidth and cold O_DIRECT
// sequential read bandwidth. Peak RSS is reset before each benchmark
// (/proc/self/clear_refs) and reported as a counter.
//
//   WEIGHTLIFT_BENCH_MODEL=DIR  (default build/bench-model, synthesized if missing)
//   WEIGHTLIFT_BENCH_SIZE=2GB
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/synth.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"

namespace {

std::string model_dir() {
  const char* d = std::getenv("WEIGHTLIFT_BENCH_MODEL");
  return d ? d : "build/bench-model";
}

const std::vector<std::string>& model_files() {
  static std::vector<std::string> files = [] {
    std::string dir = model_dir();
    if (!wl::Env::Default()->exists(dir + "/model.safetensors.index.json")) {
      const char* s = std::getenv("WEIGHTLIFT_BENCH_SIZE");
      wl::SynthOptions o;
      o.target_bytes = *wl::parse_size(s ? s : "2GB");
      auto r = wl::synth_model(dir, o);
      if (!r.ok()) {
        std::fprintf(stderr, "synth failed: %s\n", r.status().to_string().c_str());
        std::exit(1);
      }
    }
    auto f = wl::resolve_weight_files(dir);
    if (!f.ok()) std::exit(1);
    return *f;
  }();
  return files;
}

uint64_t total_bytes() {
  uint64_t n = 0;
  for (auto& f : model_files()) n += *wl::Env::Default()->file_size(f);
  return n;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

void drop_caches() {
  ::sync();
  for (auto& f : model_files()) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  std::ofstream dc("/proc/sys/vm/drop_caches");
  if (dc) dc << "1";
}

void warm_cache() {
  std::vector<char> buf(8 << 20);
  for (auto& f : model_files()) {
    int fd = ::open(f.c_str(), O_RDONLY);
    while (::read(fd, buf.data(), buf.size()) > 0) {}
    ::close(fd);
  }
}

// The machine's memory-copy limit: one thread, 256 MiB, destination pre-faulted.
void BM_Limit_Memcpy(benchmark::State& state) {
  const size_t n = size_t{256} << 20;
  auto src = *wl::Buffer::allocate(n, 4096);
  auto dst = *wl::Buffer::allocate(n, 4096);
  std::memset(src.data(), 1, n);
  std::memset(dst.data(), 2, n);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

// Copying into memory that was never touched (what a loader must do): the
// cost of faulting in fresh pages is part of this figure.
void BM_Limit_MemcpyFresh(benchmark::State& state) {
  const size_t n = size_t{256} << 20;
  auto src = *wl::Buffer::allocate(n, 4096);
  std::memset(src.data(), 1, n);
  for (auto _ : state) {
    auto dst = *wl::Buffer::allocate(n, 4096);
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n));
}

// The machine's cold-read limit: O_DIRECT sequential reads of the checkpoint, 16 MiB blocks.
void BM_Limit_DirectRead(benchmark::State& state) {
  const size_t block = size_t{16} << 20;
  auto buf = *wl::Buffer::allocate(block, 4096);
  uint64_t bytes = 0;
  for (auto _ : state) {
    state.PauseTiming();
    drop_caches();
    state.ResumeTiming();
    for (auto& f : model_files()) {
      auto file = wl::Env::Default()->open(f, {.mode = wl::FileMode::kDirect});
      uint64_t size = (*file)->size();
      for (uint64_t off = 0; off < size; off += block) {
        uint64_t len = std::min<uint64_t>(block, size - off);
        if (!(*file)->read_at(off, std::span<std::byte>(buf.data(), len)).ok()) state.SkipWithError("read failed");
        bytes += len;
      }
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

void BM_Load(benchmark::State& state, wl::Strategy strategy, bool cold) {
  wl::LoadOptions o;
  o.strategy = strategy;
  uint64_t bytes = 0;
  uint64_t peak = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (cold)
      drop_caches();
    else
      warm_cache();
    reset_peak_rss();
    uint64_t base = wl::peak_rss_bytes();
    state.ResumeTiming();
    std::vector<wl::LoadedTensor> kept;
    auto r = wl::load_files(model_files(), o, [&](wl::LoadedTensor&& t) {
      kept.push_back(std::move(t));
      return wl::Status();
    });
    if (!r.ok()) state.SkipWithError(r.status().to_string().c_str());
    bytes += total_bytes();
    state.PauseTiming();
    peak = std::max(peak, wl::peak_rss_bytes() - std::min(base, wl::peak_rss_bytes()));
    kept.clear();
    state.ResumeTiming();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["peak_rss_MiB"] = static_cast<double>(peak) / (1 << 20);
  state.counters["ckpt_MiB"] = static_cast<double>(total_bytes()) / (1 << 20);
}

BENCHMARK(BM_Limit_Memcpy)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Limit_MemcpyFresh)->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_Limit_DirectRead)->Unit(benchmark::kMillisecond)->Iterations(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_Load, lazy_hot, wl::Strategy::kLazy, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Load, eager_hot, wl::Strategy::kEager, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Load, lazy_cold, wl::Strategy::kLazy, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Load, eager_cold, wl::Strategy::kEager, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

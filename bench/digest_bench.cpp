// The hashes sources vouch for (docs/integrity.md), one core, against the
// machine's limit for reading the same memory (memcpy of the same buffer),
// both measured in this run: whether a hash keeps up with the bytes of a
// download. Reports bytes/s; compare BM_Digest/<algorithm> with BM_Memcpy.
// Noisy on a shared machine: read ratios, not absolute figures.
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>

#include "util/digest.h"

namespace {

constexpr size_t kBytes = size_t{64} << 20;
constexpr size_t kChunk = size_t{4} << 20;  // what a download hashes at a time
const char* const kAlgorithms[] = {"crc32c", "crc32", "md5", "sha1", "sha256"};

std::vector<std::byte>& data() {
  static std::vector<std::byte> d = [] {
    std::vector<std::byte> v(kBytes);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
    return v;
  }();
  return d;
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::byte> out(kChunk);
  for (auto _ : state) {
    for (size_t off = 0; off < kBytes; off += kChunk) std::memcpy(out.data(), data().data() + off, kChunk);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Digest(benchmark::State& state) {
  const std::string alg = kAlgorithms[state.range(0)];
  for (auto _ : state) {
    auto d = wl::Digest::make(alg);
    if (!d) return state.SkipWithError(("no digest " + alg).c_str());
    for (size_t off = 0; off < kBytes; off += kChunk) d->update(std::span(data().data() + off, kChunk));
    benchmark::DoNotOptimize(d->hex());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.SetLabel(alg);
}
BENCHMARK(BM_Digest)->DenseRange(0, 4)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

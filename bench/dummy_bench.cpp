// Dummy-weight fill speed against the machine's limit for writing the same
// memory (memset of the same buffer), both measured in this run. Reports
// bytes/s; compare BM_FillDummy/<dtype>/<threads> with BM_Memset. Noisy on a
// shared machine: read ratios, not absolute figures.
#include <cstring>

#include <benchmark/benchmark.h>

#include "weightlift/dummy.h"

namespace {

constexpr int64_t kBytes = int64_t{256} << 20;

void BM_Memset(benchmark::State& state) {
  auto t = wl::Tensor::empty(wl::DType::U8, {kBytes});
  for (auto _ : state) {
    std::memset(t->mutable_bytes().data(), 1, t->nbytes());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}
BENCHMARK(BM_Memset)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_FillDummy(benchmark::State& state) {
  auto dtype = static_cast<wl::DType>(state.range(0));
  int threads = static_cast<int>(state.range(1));
  auto t = wl::Tensor::empty(dtype, {kBytes / wl::dtype_size(dtype)});
  for (auto _ : state) {
    auto st = wl::fill_dummy(*t, -1e-3, 1e-3, 1234, threads);
    if (!st.ok()) state.SkipWithError(st.message().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  state.SetLabel(std::string(wl::dtype_name(dtype)));
}
BENCHMARK(BM_FillDummy)
    ->ArgsProduct({{static_cast<int64_t>(wl::DType::F32), static_cast<int64_t>(wl::DType::BF16),
                    static_cast<int64_t>(wl::DType::F8_E4M3)},
                   {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

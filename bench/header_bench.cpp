// The safetensors header of a file with 10,000 tensors (issue 30: refusing
// repeated keys must not slow the reader): parsed from memory by the reader's
// compact fast path (the header as writers write it) and by its general SAX
// path (the same header with a space after every ':'), next to a peer measured
// in the same run, nlohmann's DOM parse of the same text; and the file opened
// lazily and listed (what `weightlift ls` does), from the page cache; and
// what rendering its table adds (every name and file through inert()).
// Peak RSS (VmHWM, reset before each benchmark) is a counter.
//
//   build/bin/header_bench [--benchmark_repetitions=5]
//   WEIGHTLIFT_BENCH_TENSORS=10000 (the count)
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "weightlift/checkpoint.h"
#include "weightlift/io.h"
#include "weightlift/safetensors.h"
#include "weightlift/text.h"

namespace {

int tensor_count() {
  const char* n = std::getenv("WEIGHTLIFT_BENCH_TENSORS");
  return n ? std::atoi(n) : 10000;
}

// A model's small tensors: norms, biases, scales (F32/BF16/F16/I64, 1-2 dims).
struct Header {
  std::string compact, spaced;
  uint64_t data = 0;
};

const Header& header() {
  static Header h = [] {
    Header out;
    nlohmann::ordered_json j;
    j["__metadata__"] = {{"format", "pt"}};
    const char* dtypes[] = {"F32", "BF16", "F16", "I64"};
    const int sizes[] = {4, 2, 2, 8};
    uint64_t off = 0;
    for (int i = 0; i < tensor_count(); ++i) {
      const int d = i % 4;
      const uint64_t rows = 1 + i % 7, cols = 16 + i % 48;
      const uint64_t n = rows * cols * sizes[d];
      j["model.layers." + std::to_string(i / 10) + ".mlp.t" + std::to_string(i % 10) + ".weight"] = {
          {"dtype", dtypes[d]}, {"shape", {rows, cols}}, {"data_offsets", {off, off + n}}};
      off += n;
    }
    out.compact = j.dump();
    for (char c : out.compact) out.spaced += c == ':' ? std::string(": ") : std::string(1, c);
    out.data = off;
    return out;
  }();
  return h;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}

void BM_Parse(benchmark::State& state, bool spaced) {
  const Header& h = header();
  const std::string& text = spaced ? h.spaced : h.compact;
  reset_peak_rss();
  for (auto _ : state) {
    auto r = wl::parse_safetensors_header(text, 8 + text.size() + h.data, "bench.safetensors");
    if (!r.ok()) state.SkipWithError(r.status().to_string().c_str());
    benchmark::DoNotOptimize(r);
  }
  state.counters["tensors"] = tensor_count();
  state.counters["header_MiB"] = static_cast<double>(text.size()) / (1 << 20);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

void BM_PeerNlohmannDom(benchmark::State& state) {
  const Header& h = header();
  reset_peak_rss();
  for (auto _ : state) {
    auto j = nlohmann::json::parse(h.compact);
    benchmark::DoNotOptimize(j);
  }
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

// `weightlift ls FILE`: open lazily, list every tensor.
void BM_OpenAndList(benchmark::State& state) {
  const Header& h = header();
  static const std::string path = [&] {
    std::string p =
        (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + std::string("/wl-header-bench.safetensors");
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((h.compact.size() >> (8 * i)) & 0xff);
    bytes += h.compact;
    bytes.resize(bytes.size() + h.data, '\0');
    std::ofstream(p, std::ios::binary) << bytes;
    std::atexit([] { std::remove(path.c_str()); });
    return p;
  }();
  reset_peak_rss();
  for (auto _ : state) {
    auto ck = wl::open_checkpoint(path);
    if (!ck.ok()) state.SkipWithError(ck.status().to_string().c_str());
    size_t n = 0;
    for (const auto& t : (*ck)->tensors()) n += t.name.size();
    benchmark::DoNotOptimize(n);
  }
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}

// What `ls` adds per row since issue 30: the name and the file made inert (text.h).
void BM_InertRows(benchmark::State& state) {
  auto r = wl::parse_safetensors_header(header().compact, 8 + header().compact.size() + header().data, "b");
  const std::string file = "/models/org--model/snapshots/0123456789abcdef/model-00001-of-00002.safetensors";
  for (auto _ : state) {
    size_t n = 0;
    for (const auto& t : r->tensors) n += wl::inert(t.name).size() + wl::inert(file).size();
    benchmark::DoNotOptimize(n);
  }
}

BENCHMARK_CAPTURE(BM_Parse, compact_fast_path, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Parse, spaced_sax_path, true)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PeerNlohmannDom)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OpenAndList)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_InertRows)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

// The restricted unpickler (src/torch/torch_pickle.cpp) on a state dict's
// data.pkl as torch.save writes it: protocol 2, every object memoized, the
// rebuild function, storage class, 'storage' and 'cpu' fetched back from the
// memo after the first tensor, items in SETITEMS batches of 1000. Reports
// tensors/s for BM_Unpickle/<tensors>; BM_CopyPickle/<tensors> copies the same
// bytes once, the floor measured in the same run. Compare builds (before and
// after a change to the unpickler) by their ratio, run alternately: the
// machine is shared.
#include <cstring>
#include <string>

#include <benchmark/benchmark.h>

#include "torch/torch_pickle.h"

namespace {

// Writes pickle opcodes, memoizing as Python's pickler does (BINPUT below
// 256 entries, LONG_BINPUT from there).
class PickleWriter {
 public:
  void op(char c) { out_ += c; }
  void u32(uint32_t v) {
    for (int k = 0; k < 4; ++k) out_ += static_cast<char>((v >> (8 * k)) & 0xff);
  }
  uint32_t put() {
    uint32_t idx = memo_++;
    if (idx < 256) {
      op('q');
      out_ += static_cast<char>(idx);
    } else {
      op('r');
      u32(idx);
    }
    return idx;
  }
  void get(uint32_t idx) {
    if (idx < 256) {
      op('h');
      out_ += static_cast<char>(idx);
    } else {
      op('j');
      u32(idx);
    }
  }
  void str(const std::string& s) {  // BINUNICODE
    op('X');
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void integer(uint32_t v) {
    if (v < 256) {
      op('K');
      out_ += static_cast<char>(v);
    } else if (v < 65536) {
      op('M');
      out_ += static_cast<char>(v & 0xff);
      out_ += static_cast<char>(v >> 8);
    } else {
      op('J');
      u32(v);
    }
  }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
  uint32_t memo_ = 0;
};

// {"model.layers.<k/8>.w<k%8>.weight": float16 tensor (rows, cols)} for k < n.
std::string state_dict_pickle(size_t n) {
  PickleWriter w;
  w.op('\x80');
  w.op('\x02');
  w.op('}');
  w.put();
  uint32_t rebuild = 0, storage = 0, half = 0, cpu = 0, ordered_dict = 0;
  for (size_t k = 0; k < n; ++k) {
    if (k % 1000 == 0) w.op('(');
    const uint32_t rows = 64 + static_cast<uint32_t>(k % 7), cols = 4096;
    w.str("model.layers." + std::to_string(k / 8) + ".w" + std::to_string(k % 8) + ".weight");
    w.put();
    if (k == 0) {
      w.global("torch._utils", "_rebuild_tensor_v2");
      rebuild = w.put();
    } else {
      w.get(rebuild);
    }
    w.op('(');
    w.op('(');
    if (k == 0) {
      w.str("storage");
      storage = w.put();
      w.global("torch", "HalfStorage");
      half = w.put();
    } else {
      w.get(storage);
      w.get(half);
    }
    w.str(std::to_string(k));
    w.put();
    if (k == 0) {
      w.str("cpu");
      cpu = w.put();
    } else {
      w.get(cpu);
    }
    w.integer(rows * cols);
    w.op('t');
    w.put();
    w.op('Q');
    w.integer(0);
    w.integer(rows);
    w.integer(cols);
    w.op('\x86');
    w.put();
    w.integer(cols);
    w.integer(1);
    w.op('\x86');
    w.put();
    w.op('\x89');
    if (k == 0) {
      w.global("collections", "OrderedDict");
      ordered_dict = w.put();
    } else {
      w.get(ordered_dict);
    }
    w.op(')');
    w.op('R');
    w.put();
    w.op('t');
    w.put();
    w.op('R');
    w.put();
    if (k % 1000 == 999 || k + 1 == n) w.op('u');
  }
  w.op('.');
  return std::move(w.bytes());
}

void BM_Unpickle(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::string data = state_dict_pickle(n);
  for (auto _ : state) {
    size_t storages = 0;
    wl::pickle::Unpickler u("bench.pkl",
                            [&](const wl::pickle::StorageRequest&) -> wl::Result<size_t> { return storages++; });
    auto root = u.load(data);
    if (!root.ok() || u.tensors().size() != n) {
      state.SkipWithError(root.ok() ? "wrong tensor count" : root.status().to_string().c_str());
      break;
    }
    benchmark::DoNotOptimize(*root);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(n));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data.size()));
}
BENCHMARK(BM_Unpickle)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_CopyPickle(benchmark::State& state) {
  const std::string data = state_dict_pickle(static_cast<size_t>(state.range(0)));
  std::string copy(data.size(), '\0');
  for (auto _ : state) {
    std::memcpy(copy.data(), data.data(), data.size());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data.size()));
}
BENCHMARK(BM_CopyPickle)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

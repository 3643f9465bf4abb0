// Helpers for the engine tests: a read-counting Env and small checkpoints.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/safetensors.h"

namespace wl::testing {

struct ReadRecord {
  std::string path;
  uint64_t offset = 0, len = 0;
  std::thread::id thread = std::this_thread::get_id();  // the reading thread
};

// Wraps every opened file; records each read_at(). view() is forwarded (mmap
// reads are not counted), so selectivity tests use read_at-based strategies.
class CountingEnv : public EnvWrapper {
 public:
  CountingEnv() : EnvWrapper(Env::Default()) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override;
  std::vector<ReadRecord> reads() const {
    std::lock_guard lk(mu_);
    return reads_;
  }
  std::vector<std::string> opened() const {
    std::lock_guard lk(mu_);
    return opened_;
  }
  void record(ReadRecord r) {
    std::lock_guard lk(mu_);
    reads_.push_back(std::move(r));
  }
  // When set, every file reports this page-cache residency (cold or warm
  // on demand, whatever the kernel holds).
  std::optional<double> cached;
  // When set, the residency of a file's byte range (cached_fraction_in),
  // before `cached`.
  std::optional<double> cached_in;
  // Readahead hints given (Advice::kWillNeed).
  std::atomic<size_t> will_need{0};
  // How long each page-in (Advice::kPopulate) takes at least.
  std::chrono::milliseconds populate_delay{0};

 private:
  mutable std::mutex mu_;
  std::vector<ReadRecord> reads_;
  std::vector<std::string> opened_;
};

class CountingFile : public RandomAccessFile {
 public:
  CountingFile(std::shared_ptr<RandomAccessFile> f, CountingEnv* env) : f_(std::move(f)), env_(env) {}
  const std::string& path() const override { return f_->path(); }
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    env_->record({f_->path(), offset, dst.size()});
    return f_->read_at(offset, dst);
  }
  Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override { return f_->view(offset, n); }
  size_t alignment() const override { return f_->alignment(); }
  // Mapping pages in reads them too (prefetch, file views): counted as a read.
  void advise(uint64_t offset, uint64_t n, Advice a) const override {
    if (a == Advice::kPopulate) {
      env_->record({f_->path(), offset, n});
      if (env_->populate_delay.count() > 0) std::this_thread::sleep_for(env_->populate_delay);
    }
    if (a == Advice::kWillNeed) ++env_->will_need;
    f_->advise(offset, n, a);
  }
  std::string version() const override { return f_->version(); }
  double cached_fraction() const override { return env_->cached ? *env_->cached : f_->cached_fraction(); }
  double cached_fraction_in(uint64_t offset, uint64_t n) const override {
    return env_->cached_in ? *env_->cached_in : env_->cached ? *env_->cached : f_->cached_fraction_in(offset, n);
  }

 private:
  std::shared_ptr<RandomAccessFile> f_;
  CountingEnv* env_;
};

inline Result<std::shared_ptr<RandomAccessFile>> CountingEnv::open(const std::string& path, const OpenOptions& o) {
  {
    std::lock_guard lk(mu_);
    opened_.push_back(path);
  }
  WL_ASSIGN_OR_RETURN(auto f, target()->open(path, o));
  return std::shared_ptr<RandomAccessFile>(std::make_shared<CountingFile>(std::move(f), this));
}

// A deterministic F32 tensor: element i of tensor `seed` is seed*1000 + i.
inline Tensor make_f32(Shape shape, int seed) {
  Tensor t = *Tensor::empty(DType::F32, shape);
  auto* p = reinterpret_cast<float*>(t.mutable_bytes().data());
  for (uint64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(seed * 1000 + static_cast<int64_t>(i));
  return t;
}

inline void write_st(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& ts) {
  std::vector<NamedTensor> nt;
  for (auto& [n, t] : ts) nt.push_back({n, t.view()});
  Status s = write_safetensors(path, nt);
  if (!s.ok()) throw std::runtime_error(s.to_string());
}

// name -> bytes of every tensor a load delivers.
inline Result<std::map<std::string, std::string>> load_all(const std::vector<std::string>& files, const LoadOptions& o,
                                                           LoadStats* stats = nullptr) {
  std::map<std::string, std::string> out;
  auto r = load_files(files, o, [&](LoadedTensor&& t) {
    out[t.name] = std::string(reinterpret_cast<const char*>(t.view.data()), t.view.nbytes());
    return Status();
  });
  if (!r.ok()) return r.status();
  if (stats) *stats = *r;
  return out;
}

}  // namespace wl::testing

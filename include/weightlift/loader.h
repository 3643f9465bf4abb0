// weightlift/loader.h: loading every tensor of a checkpoint into host memory.
//
// load_files() materializes each tensor into memory the caller then owns
// (a private buffer, or a whole-file buffer shared by that file's tensors)
// and hands it to `sink` as soon as it is complete. The sink is called from
// one thread at a time, in no promised order across files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

enum class Strategy {
  kLazy,   // mmap each file, copy each tensor out of the mapping
  kEager,  // read each file whole with one read, tensors are views into that buffer
};

// "lazy" / "eager"; nullopt when unknown.
std::optional<Strategy> strategy_from_name(std::string_view name);
std::string_view strategy_name(Strategy s);

struct LoadedTensor {
  std::string name;
  std::string file;
  TensorView view;  // owns (shares) its bytes
};

struct LoadProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t tensors_done = 0, tensors_total = 0;
  uint64_t files_done = 0, files_total = 0;
};

struct LoadOptions {
  Strategy strategy = Strategy::kLazy;
  Env* env = Env::Default();
  // Called after each tensor; return false to cancel (the load fails with kCancelled).
  std::function<bool(const LoadProgress&)> progress;
};

struct LoadStats {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Loads every tensor of the given safetensors files.
Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& options,
                             const std::function<Status(LoadedTensor&&)>& sink);

// The weight files a user means by PATH: a file is itself; a folder gives the
// files its model.safetensors.index.json names, else its *.safetensors in natural order.
Result<std::vector<std::string>> resolve_weight_files(const std::string& path, Env* env = Env::Default());

// Peak resident set size of this process, in bytes (VmHWM).
uint64_t peak_rss_bytes();

}  // namespace wl

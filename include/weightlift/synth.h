// weightlift/synth.h: deterministic Llama-shaped Hugging Face model folders,
// for the demo, the tests and the benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weightlift/status.h"

namespace wl {

struct SynthOptions {
  uint64_t target_bytes = uint64_t{64} << 20;  // approximate total tensor bytes
  uint64_t seed = 0;                           // same seed + size => same bytes
  int min_shards = 2;
};

// "SMALL" (64 MiB), "TINY" (4 MiB), "MEDIUM" (512 MiB), or a size such as
// "1GB", "512MB", "2GiB", "300000" (bytes). kInvalidArgument otherwise.
Result<uint64_t> parse_size(std::string_view text);

struct SynthResult {
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // tensor bytes (the index's total_size)
  int shards = 0;
  int layers = 0;
  int hidden = 0;
};

// Writes config.json, model-0000k-of-0000n.safetensors shards (BF16 weights,
// F32 norms) and model.safetensors.index.json into `dir` (created if needed).
// Every file is written atomically.
Result<SynthResult> synth_model(const std::string& dir, const SynthOptions& options);

}  // namespace wl

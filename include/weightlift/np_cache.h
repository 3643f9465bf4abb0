// weightlift/np_cache.h: the reference's NumPy weight cache (what vLLM's
// np_cache_weights_iterator does): a folder `np/` beside the weights, one
// .npy file per tensor named exactly like the tensor (no extension), and
// `np/weight_names.json` listing the names in order. It is dumped once,
// under an exclusive lock, by the first process; the others wait and read it
// back. Any format the registry opens (checkpoint.h) can be dumped, so the
// cache stands above the formats, beside the other conversion (convert.h).
//
// Thread-safety: the functions are reentrant; np_cache_prepare() serializes
// processes and threads on its lock.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

inline constexpr std::string_view kNpCacheFolder = "np";
inline constexpr std::string_view kNpCacheNames = "weight_names.json";

struct NpCacheResult {
  std::string np_folder;
  std::vector<std::string> names;  // in dump order
  bool dumped = false;             // this call wrote the cache (false: it was there already)
};

// Ensures `<hf_folder>/np/` holds the tensors of `weight_files` (PyTorch
// .bin/.pt or safetensors): under an exclusive lock on `lock_path` (default
// `<hf_folder>/np.lock`), dumps every tensor unless weight_names.json exists.
// A tensor name that is not a plain file name ("/", "..", empty, a control
// character: text.h's has_control_chars) is refused before anything is written.
Result<NpCacheResult> np_cache_prepare(const std::vector<std::string>& weight_files, const std::string& hf_folder,
                                       const std::string& lock_path = {}, Env* env = Env::Default());

// Reads weight_names.json of a prepared cache (names in order).
Result<std::vector<std::string>> np_cache_names(const std::string& hf_folder);
// One cached tensor.
Result<Tensor> np_cache_read(const std::string& hf_folder, const std::string& name, Env* env = Env::Default());

}  // namespace wl

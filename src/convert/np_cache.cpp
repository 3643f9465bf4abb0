// The reference's NumPy weight cache (weightlift/np_cache.h): np/ beside the
// weights, dumped once under a lock.
#include "weightlift/np_cache.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "weightlift/checkpoint.h"
#include "weightlift/lock.h"
#include "weightlift/npy.h"
#include "weightlift/text.h"

namespace wl {
namespace {
namespace fs = std::filesystem;

// A tensor name that names a file of the cache: no folder, no traversal, no
// control character (a name from a file never puts one in a path).
bool plain_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && !has_control_chars(n) &&
         n != kNpCacheNames;
}
}  // namespace

Result<std::vector<std::string>> np_cache_names(const std::string& hf_folder) {
  std::string path = (fs::path(hf_folder) / kNpCacheFolder / kNpCacheNames).string();
  WL_ASSIGN_OR_RETURN(std::string text, read_file_to_string(path, uint64_t{1} << 28));
  try {
    auto j = nlohmann::json::parse(text);
    if (!j.is_array()) return Status::Corrupt("weight_names.json is not a list").with_file(path);
    std::vector<std::string> names;
    for (auto& n : j) {
      if (!n.is_string() || !plain_file_name(n.get<std::string>()))
        return Status::Corrupt("weight_names.json holds an entry that is not a plain file name").with_file(path);
      names.push_back(n.get<std::string>());
    }
    return names;
  } catch (const nlohmann::json::exception& e) {
    return Status::Corrupt(std::string("weight_names.json is not valid JSON: ") + e.what()).with_file(path);
  }
}

Result<Tensor> np_cache_read(const std::string& hf_folder, const std::string& name, Env* env) {
  if (!plain_file_name(name)) return Status::InvalidArgument("not a plain file name").with_tensor(name);
  WL_ASSIGN_OR_RETURN(Tensor t, read_npy((fs::path(hf_folder) / kNpCacheFolder / name).string(), env), .tensor = name);
  return t;
}

Result<NpCacheResult> np_cache_prepare(const std::vector<std::string>& weight_files, const std::string& hf_folder,
                                       const std::string& lock_path, Env* env) {
  NpCacheResult res;
  res.np_folder = (fs::path(hf_folder) / kNpCacheFolder).string();
  if (Status s = env->create_dirs(res.np_folder); !s.ok())
    return Status(s.code(), "cannot create the NumPy cache folder: " + s.message()).with_file(res.np_folder);
  std::string lock = lock_path.empty() ? (fs::path(hf_folder) / "np.lock").string() : lock_path;
  CrossProcessLock held(lock);  // released when it goes out of scope
  WL_RETURN_IF_ERROR(held.acquire());
  std::string names_path = (fs::path(res.np_folder) / kNpCacheNames).string();
  if (!env->exists(names_path)) {
    std::vector<std::string> names;
    for (auto& f : weight_files) {
      WL_ASSIGN_OR_RETURN(auto ck, open_checkpoint(f, env));
      for (size_t i = 0; i < ck->tensors().size(); ++i) {
        const std::string& name = ck->tensors()[i].name;
        if (!plain_file_name(name))
          return Status::InvalidArgument("tensor name cannot be a NumPy cache file name")
              .with_file(f)
              .with_tensor(name);
        WL_ASSIGN_OR_RETURN(TensorView v, ck->view(i));
        WL_RETURN_IF_ERROR(write_npy((fs::path(res.np_folder) / name).string(), v, env), .tensor = name);
        names.push_back(name);
      }
    }
    // The names file is written last: its presence means the cache is complete.
    WL_RETURN_IF_ERROR(write_file_atomic(names_path, nlohmann::json(names).dump() + "\n", env));
    res.dumped = true;
  }
  WL_ASSIGN_OR_RETURN(res.names, np_cache_names(hf_folder));
  return res;
}

}  // namespace wl

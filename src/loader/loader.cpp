#include "weightlift/loader.h"

#include <chrono>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "weightlift/safetensors.h"
#include "weightlift/weight_files.h"

namespace wl {

std::optional<Strategy> strategy_from_name(std::string_view name) {
  if (name == "lazy") return Strategy::kLazy;
  if (name == "eager") return Strategy::kEager;
  return std::nullopt;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kLazy: return "lazy";
    case Strategy::kEager: return "eager";
  }
  return "?";
}

Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& options,
                             const std::function<Status(LoadedTensor&&)>& sink) {
  auto t0 = std::chrono::steady_clock::now();
  LoadProgress p;
  p.files_total = files.size();
  std::vector<std::shared_ptr<SafetensorsFile>> opened;
  opened.reserve(files.size());
  const LoadMode mode = options.strategy == Strategy::kEager ? LoadMode::kEager : LoadMode::kLazy;
  // Lazy: headers first, so progress knows the total. Only the first files
  // stay open for the second pass: each holds a descriptor and a mapping, and
  // checkpoints with thousands of shards would exceed the descriptor limit
  // (1024 by default); the others are opened again when their turn comes.
  constexpr size_t kKeepOpen = 64;
  if (mode == LoadMode::kLazy) {
    for (auto& f : files) {
      WL_ASSIGN_OR_RETURN(auto sf, SafetensorsFile::open(f, mode, options.env));
      for (auto& t : sf->tensors()) p.bytes_total += t.nbytes;
      p.tensors_total += sf->tensors().size();
      opened.push_back(opened.size() < kKeepOpen ? std::move(sf) : nullptr);
    }
  } else {
    for (auto& f : files) {
      WL_ASSIGN_OR_RETURN(uint64_t sz, options.env->file_size(f));
      p.bytes_total += sz;
    }
  }
  LoadStats stats;
  for (size_t i = 0; i < files.size(); ++i) {
    std::shared_ptr<SafetensorsFile> sf;
    if (mode == LoadMode::kLazy) {
      sf = opened[i];
      if (!sf) {
        WL_ASSIGN_OR_RETURN(sf, SafetensorsFile::open(files[i], mode, options.env));
      }
      sf->file()->advise(0, sf->file_size(), Advice::kSequential);
    } else {
      WL_ASSIGN_OR_RETURN(sf, SafetensorsFile::open(files[i], mode, options.env));
      p.tensors_total += sf->tensors().size();
      // The header and padding count as read too.
      p.bytes_done += sf->header().data_start;
    }
    for (const auto& info : sf->tensors()) {
      LoadedTensor lt;
      lt.name = info.name;
      lt.file = files[i];
      if (mode == LoadMode::kEager) {
        WL_ASSIGN_OR_RETURN(lt.view, sf->get(info.name));
      } else {
        WL_ASSIGN_OR_RETURN(Tensor owned, sf->read(info.name));
        lt.view = owned.view();
      }
      stats.tensors++;
      stats.bytes += info.nbytes;
      p.bytes_done += info.nbytes;
      p.tensors_done++;
      WL_RETURN_IF_ERROR(sink(std::move(lt)));
      if (options.progress && !options.progress(p))
        return Status::Cancelled("load cancelled by the progress callback").with_file(files[i]);
    }
    if (mode == LoadMode::kLazy) opened[i].reset();
    p.files_done++;
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace wl

#include "weightlift/weight_files.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/json_strict.h"
#include "weightlift/checkpoint.h"

namespace wl {

bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    bool da = std::isdigit(static_cast<unsigned char>(a[i])), db = std::isdigit(static_cast<unsigned char>(b[j]));
    if (da && db) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string_view na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
      // compare numerically without overflow: strip leading zeros, then length, then digits
      auto strip = [](std::string_view s) {
        size_t k = 0;
        while (k + 1 < s.size() && s[k] == '0') ++k;
        return s.substr(k);
      };
      std::string_view sa = strip(na), sb = strip(nb);
      if (sa.size() != sb.size()) return sa.size() < sb.size();
      if (sa != sb) return sa < sb;
      i = i2, j = j2;
    } else if (da != db) {
      return da;  // Python compares int < str would raise; digits first keeps it total
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

std::vector<std::string> natural_key(std::string_view name) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < name.size();) {
    size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (j > i) {
      out.emplace_back(name.substr(i, j - i));
      out.emplace_back();
      i = j;
      continue;
    }
    out.back() += name[i++];
  }
  return out;
}

void natural_sort(std::vector<std::string>& paths) {
  // By what follows the last '/', as os.path.basename ("" for "a/b/"), not
  // base_name(), which names the folder of a trailing slash.
  auto last = [](std::string_view p) {
    const size_t k = p.rfind('/');
    return k == std::string_view::npos ? p : p.substr(k + 1);
  };
  std::stable_sort(paths.begin(), paths.end(),
                   [&](const std::string& x, const std::string& y) { return natural_less(last(x), last(y)); });
}

Result<std::vector<std::string>> filter_duplicate_safetensors_files(const std::vector<std::string>& files,
                                                                    const std::string& folder,
                                                                    std::string_view index_name, Env* env) {
  std::string index_path = join_path(folder, index_name);
  if (!env->exists(index_path)) return files;
  // Read through `env` (not read_file_to_string, which always uses the default Env).
  WL_ASSIGN_OR_RETURN(auto index_file, env->open(index_path, {.mode = FileMode::kPread}));
  if (index_file->size() > (uint64_t{256} << 20))
    return Status::Corrupt(fmt::format("index of {} bytes is larger than 256 MiB", index_file->size()))
        .with_file(index_path);
  std::string text(index_file->size(), '\0');
  WL_RETURN_IF_ERROR(index_file->read_at(0, std::as_writable_bytes(std::span(text.data(), text.size()))));
  std::string error;
  auto parsed = parse_json_strict(text, &error);  // a repeated key (a tensor mapped twice) is refused
  if (!parsed) return Status::Corrupt("index is not a JSON object: " + error).with_file(index_path);
  const nlohmann::json& doc = *parsed;
  if (!doc.is_object()) return Status::Corrupt("index is not a JSON object").with_file(index_path);
  auto wm = doc.find("weight_map");
  if (wm == doc.end() || !wm->is_object())
    return Status::Corrupt("index has no weight_map object").with_file(index_path);
  std::set<std::string> wanted;
  for (auto& [name, f] : wm->items()) {
    if (!f.is_string())
      return Status::Corrupt(fmt::format("weight_map entry '{}' is not a string", name)).with_file(index_path);
    const std::string& rel = f.get_ref<const std::string&>();
    if (rel.empty() || rel.front() == '/' || rel.find("..") != std::string::npos)
      return Status::Corrupt(fmt::format("weight_map entry '{}' names an unsafe path '{}'", name, rel))
          .with_file(index_path);
    wanted.insert(join_path(folder, rel));
  }
  for (auto& w : wanted)
    if (!env->exists(w))
      return Status::NotFound(fmt::format("index names {} which does not exist", base_name(w))).with_file(index_path);
  std::vector<std::string> out;
  for (auto& f : files)
    if (wanted.count(f)) out.push_back(f);
  return out;
}

std::vector<std::string> filter_files_not_needed_for_inference(const std::vector<std::string>& files) {
  static const char* kBlack[] = {"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"};
  std::vector<std::string> out;
  for (auto& f : files) {
    bool drop = false;
    for (const char* b : kBlack) drop |= std::string_view(f).ends_with(b);
    if (!drop) out.push_back(f);
  }
  return out;
}

namespace {

// Why a URL is neither a folder (a prefix with objects under it) nor a file:
// the source's own answer (access denied with the server's error code, no
// such bucket, no such key) rather than a bare "not found".
Status missing_url(const std::string& path, Env* env) {
  auto entries = env->list_dir(path);
  if (!entries.ok() && entries.status().code() != Code::kUnimplemented) return entries.status();
  if (path.back() != '/') {
    auto size = env->file_size(path);
    if (!size.ok()) return size.status();
  }
  return Status::NotFound("no such object, and no objects under it as a prefix").with_file(path);
}

}  // namespace

Result<WeightFiles> find_weight_files(const std::string& path, Env* env) {
  WeightFiles wf;
  if (!env->is_directory(path)) {
    if (!env->exists(path) && is_url(path)) return missing_url(path, env);
    if (!env->exists(path)) return Status::NotFound("no such file or directory").with_file(path);
    wf.files = {path};
    if (const CheckpointFormat* f = checkpoint_format_for_name(path)) wf.format = f->id;
    return wf;
  }
  WL_ASSIGN_OR_RETURN(auto entries, env->list_dir(path));
  const std::pair<std::string_view, WeightFormat> patterns[] = {
      {".safetensors", WeightFormat::kSafetensors}, {".bin", WeightFormat::kPytorch}, {".pt", WeightFormat::kPytorch}};
  for (auto& [ext, fmt_] : patterns) {
    std::vector<std::string> hits;
    for (auto& e : entries)
      if (!e.is_dir && std::string_view(e.name).ends_with(ext)) hits.push_back(join_path(path, e.name));
    if (hits.empty()) continue;
    wf.format = fmt_;
    if (fmt_ == WeightFormat::kSafetensors) {
      WL_ASSIGN_OR_RETURN(hits, filter_duplicate_safetensors_files(hits, path, kSafetensorsIndexName, env));
    }
    hits = filter_files_not_needed_for_inference(hits);
    if (hits.empty() && fmt_ == WeightFormat::kSafetensors)  // the reference stops at safetensors too
      return Status::NotFound(
                 fmt::format("{} names none of the *.safetensors files in the folder", kSafetensorsIndexName))
          .with_file(path);
    if (hits.empty()) continue;
    natural_sort(hits);
    wf.files = std::move(hits);
    return wf;
  }
  return Status::NotFound("no *.safetensors, *.bin or *.pt weight files in folder").with_file(path);
}

Result<std::vector<std::string>> resolve_weight_files(const std::string& path, Env* env) {
  WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(path, env));
  return wf.files;
}

}  // namespace wl

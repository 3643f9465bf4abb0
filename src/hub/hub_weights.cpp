// vLLM's weight-selection logic on top of the Hub, resolve_model_path, ModelScope.
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "hub/hub_internal.h"
#include "util/json_strict.h"
#include "weightlift/hash.h"
#include "weightlift/io.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using json = nlohmann::json;

void log_line(const HubOptions& o, const std::string& s) {
  if (o.log) o.log(inert(s));
}

// Files under `folder` (relative names, recursive, following snapshot symlinks).
void walk(Env* env, const std::string& folder, const std::string& rel, std::vector<std::string>& out, int depth = 0) {
  if (depth > 32) return;
  auto entries = env->list_dir(folder + (rel.empty() ? "" : "/" + rel));
  if (!entries.ok()) return;
  for (const auto& e : *entries) {
    std::string r = rel.empty() ? e.name : rel + "/" + e.name;
    if (env->is_directory(folder + "/" + r))
      walk(env, folder, r, out, depth + 1);
    else
      out.push_back(r);
  }
}

}  // namespace

// The allow-pattern groups download_weights_from_hf tries in turn (each one
// snapshot_download call): the repository is listed once and reduced to the
// first pattern that matches a file, or, with "*.safetensors" allowed and an
// index in the repository, to exactly the files its weight_map names.
// *listed: whether the listing succeeded (else every pattern is a group).
Status download_weight_groups(const std::string& model, const std::vector<std::string>& allow_patterns,
                              const std::string& revision, const HubOptions& o, const std::string& subfolder,
                              std::vector<std::vector<std::string>>* groups, bool* listed) {
  groups->clear();
  for (const auto& p : allow_patterns) groups->push_back({p});
  *listed = false;
  const bool wants_st =
      std::find(allow_patterns.begin(), allow_patterns.end(), "*.safetensors") != allow_patterns.end();
  // The exact files the index's weight_map names (one group), from the index at `index_path`.
  auto from_index = [&](const std::string& index_path) -> Status {
    WL_ASSIGN_OR_RETURN(std::string text, read_file_to_string(index_path, 256ull << 20, hub_env(o)));
    std::set<std::string> wanted;
    std::string error;
    auto parsed = parse_json_strict(text, &error);  // a repeated key is refused, not read one way here, another there
    if (!parsed) return Status::Corrupt("malformed safetensors index: " + error).with_file(index_path);
    try {
      const json& j = *parsed;
      for (const auto& [k, v] : j.at("weight_map").items())
        if (v.is_string()) wanted.insert(v.get<std::string>());
    } catch (const std::exception& e) {
      return Status::Corrupt(std::string("malformed safetensors index: ") + e.what()).with_file(index_path);
    }
    groups->clear();
    if (wanted.empty()) {
      groups->push_back({"*.safetensors"});
      return Status();
    }
    std::vector<std::string> g;
    for (const auto& f : wanted) {
      WL_RETURN_IF_ERROR(check_repo_path(f));
      std::string esc;  // exact names: escape the fnmatch metacharacters
      for (char ch : f) {
        if (ch == '*' || ch == '?' || ch == '[')
          esc += std::string("[") + ch + "]";
        else
          esc += ch;
      }
      g.push_back(subfolder.empty() ? esc : subfolder + "/" + esc);
    }
    groups->push_back(std::move(g));
    return Status();
  };
  if (hub_offline(o)) {
    // No listing offline; a cached index still narrows the selection to its shards (so files the
    // download skipped, such as a consolidated copy, do not make the snapshot look incomplete).
    if (wants_st)
      if (auto idx = hf_hub_download(model, std::string(kSafetensorsIndexName), revision, o, subfolder); idx.ok())
        return from_index(*idx);
    return Status();
  }
  auto tree = list_repo_tree(model, revision, subfolder, /*recursive=*/false, o);
  if (!tree.ok()) {
    if (tree.status().message().starts_with("revision not found")) return tree.status();
    log_line(o, "cannot list the files of " + model + " (" + tree.status().to_string() +
                    "); trying each allow pattern in turn");
    return Status();
  }
  *listed = true;
  std::vector<std::string> names;
  for (const auto& e : *tree) names.push_back(e.path);
  const std::string index = (subfolder.empty() ? "" : subfolder + "/") + std::string(kSafetensorsIndexName);
  if (wants_st && std::find(names.begin(), names.end(), index) != names.end()) {
    WL_ASSIGN_OR_RETURN(std::string index_path,
                        hf_hub_download(model, std::string(kSafetensorsIndexName), revision, o, subfolder));
    return from_index(index_path);
  }
  for (const auto& p : allow_patterns)
    if (!filter_repo_files(names, {p}, {}).empty()) {
      *groups = {{p}};
      break;
    }
  return Status();
}

Result<std::string> download_weights_from_hf(const std::string& model, const std::vector<std::string>& allow_patterns,
                                             const std::string& revision,
                                             const std::vector<std::string>& ignore_patterns, const HubOptions& o,
                                             const std::string& subfolder) {
  if (allow_patterns.empty()) return Status::InvalidArgument("download_weights_from_hf: no allow patterns");
  if (use_modelscope()) {
    WL_ASSIGN_OR_RETURN(ModelLock lock, ModelLock::acquire(model, o.cache_dir));
    if (hub_env(o)->exists(model)) return model;
    SnapshotOptions s;
    s.revision = revision == "main" ? "master" : revision;
    s.allow_patterns = allow_patterns;
    s.ignore_patterns = ignore_patterns;
    return modelscope_snapshot_download(model, s, o);
  }
  std::vector<std::vector<std::string>> groups;
  bool listed = false;
  WL_RETURN_IF_ERROR(download_weight_groups(model, allow_patterns, revision, o, subfolder, &groups, &listed));
  WL_ASSIGN_OR_RETURN(ModelLock lock, ModelLock::acquire(model, o.cache_dir));
  std::string folder;
  for (const auto& g : groups) {
    SnapshotOptions s;
    s.revision = revision;
    s.allow_patterns = g;
    s.ignore_patterns = ignore_patterns;
    WL_ASSIGN_OR_RETURN(folder, snapshot_download(model, s, o));
    std::vector<std::string> have;
    walk(hub_env(o), folder, "", have);
    if (g.size() > 1 || !filter_repo_files(have, g, {}).empty()) break;
  }
  return folder;
}

Status download_safetensors_index_file_from_hf(const std::string& model, const std::string& index_file,
                                               const std::string& revision, const HubOptions& o,
                                               const std::string& subfolder) {
  WL_ASSIGN_OR_RETURN(ModelLock lock, ModelLock::acquire(model, o.cache_dir));
  auto r = hf_hub_download(model, index_file, revision, o, subfolder);
  if (r.ok()) return Status();
  if (r.status().code() == Code::kNotFound) {
    log_line(o, "no " + index_file + " for " + model + " (" + r.status().message() + ")");
    return Status();
  }
  return r.status();
}

Result<std::string> resolve_model_path(const std::string& path_or_repo, const std::string& revision,
                                       const HubOptions& o) {
  // A URL (s3://, gs://, http(s)://) is read where it is: its source reports what is wrong with it.
  if (is_url(path_or_repo) || hub_env(o)->exists(path_or_repo)) return path_or_repo;
  if (path_or_repo.empty() || path_or_repo.front() == '/' || path_or_repo.front() == '.')
    return Status::NotFound("no such file or folder").with_file(path_or_repo);
  Status id = check_repo_id(path_or_repo);
  if (!id.ok())
    return Status::NotFound("no such file or folder, and not a repository id: " + id.message()).with_file(path_or_repo);
  WL_ASSIGN_OR_RETURN(std::string folder,
                      download_weights_from_hf(path_or_repo, {"*.safetensors", "*.bin", "*.pt"}, revision, {}, o));
  if (use_modelscope()) return folder;
  WL_RETURN_IF_ERROR(
      download_safetensors_index_file_from_hf(path_or_repo, std::string(kSafetensorsIndexName), revision, o));
  // Configs ride along (small); a failure here does not hide the weights.
  SnapshotOptions s;
  s.revision = revision;
  s.allow_patterns = {"*.json"};
  auto cfg = snapshot_download(path_or_repo, s, o);
  if (!cfg.ok()) log_line(o, "could not fetch the JSON configs of " + path_or_repo + ": " + cfg.status().to_string());
  return folder;
}

Result<std::string> download_config_files(const std::string& repo_id, const std::string& revision,
                                          const std::string& pattern, const std::string& cache_dir, HubOptions o) {
  SnapshotOptions s;
  if (!revision.empty()) s.revision = revision;
  s.allow_patterns = {pattern};
  if (!cache_dir.empty()) o.cache_dir = cache_dir;
  return snapshot_download(repo_id, s, o);
}

}  // namespace wl

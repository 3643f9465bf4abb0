// ModelScope (VLLM_USE_MODELSCOPE): modelscope's snapshot_download subset,
// with the Hub path's care: the revision checked before it becomes a path,
// listed sizes admitted against the free disk before a byte is written,
// every file verified against the listing's Sha256 before it takes its name,
// and files already there re-verified, a stale one fetched again. A sidecar
// remembers which (device, inode, size, mtime) hashed to which Sha256, so a
// warm cache is not rehashed on every load (docs/integrity.md).
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hub/hub_internal.h"
#include "util/checked.h"
#include "util/json_strict.h"
#include "weightlift/hash.h"
#include "weightlift/io.h"

namespace wl {
namespace {

using json = nlohmann::json;

struct MsFile {
  std::string path, sha256;  // sha256: lower-case hex, or empty when the listing gives none
  uint64_t size = 0;
};

std::string modelscope_cache(const HubOptions& o) {
  const char* home = std::getenv("HOME");
  const char* ms_cache = std::getenv("MODELSCOPE_CACHE");
  return !o.cache_dir.empty()      ? o.cache_dir
         : (ms_cache && *ms_cache) ? std::string(ms_cache)
                                   : std::string(home ? home : "/root") + "/.cache/modelscope";
}

std::string modelscope_endpoint(const HubOptions& o) {
  const char* dom = std::getenv("MODELSCOPE_DOMAIN");
  std::string endpoint = !o.endpoint.empty() ? o.endpoint
                         : (dom && *dom)     ? std::string(dom)
                                             : "https://www.modelscope.cn";
  if (endpoint.find("://") == std::string::npos) endpoint = "https://" + endpoint;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

bool has_entries(Env* env, const std::string& dir) {
  auto e = env->list_dir(dir);
  return e.ok() && !e->empty();
}

// modelscope's own layout (modelscope-hub: {cache}/models/{owner}--{name}/snapshots/{revision}), or a
// folder of its older layout (dots in the name as "___") that already holds files, which it reuses.
std::string modelscope_folder(Env* env, const std::string& cache, const std::string& owner, const std::string& name,
                              const std::string& revision) {
  std::string legacy_name = name;
  for (size_t p = legacy_name.find('.'); p != std::string::npos; p = legacy_name.find('.', p + 3))
    legacy_name.replace(p, 1, "___");
  for (const std::string& legacy :
       {cache + "/models/" + owner + "/" + legacy_name, cache + "/hub/models/" + owner + "/" + legacy_name})
    if (has_entries(env, legacy)) return legacy;
  return cache + "/models/" + owner + "--" + name + "/snapshots/" + revision;
}

// One listed file: a plain relative name, a size that is a byte count, a Sha256 that is one.
Result<MsFile> parse_entry(const json& f, const std::string& url) {
  MsFile m;
  m.path = f.at("Path").get<std::string>();
  WL_RETURN_IF_ERROR(check_repo_path(m.path));
  if (f.contains("Size")) {
    const json& size = f["Size"];
    if (!size.is_number_unsigned() && !(size.is_number_integer() && size.get<int64_t>() >= 0))
      return Status::Corrupt(fmt::format("ModelScope lists {} with size {}, not a byte count (from {})", m.path,
                                         size.dump().substr(0, 40), url));
    m.size = size.get<uint64_t>();
  }
  if (f.contains("Sha256") && f["Sha256"].is_string()) {
    m.sha256 = f["Sha256"].get<std::string>();
    for (auto& ch : m.sha256) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (!m.sha256.empty() && !is_hex_of(m.sha256, 64))
      return Status::Corrupt(
          fmt::format("ModelScope lists {} with a Sha256 that is not 64 hex digits (from {})", m.path, url));
  }
  return m;
}

Result<std::vector<MsFile>> list_files(HttpClient& http, const std::vector<std::pair<std::string, std::string>>& h,
                                       const std::string& base, const std::string& model_id,
                                       const std::string& revision) {
  HttpRequest req;
  req.url = base + "/repo/files?Revision=" + url_quote(revision, false) + "&Recursive=True";
  req.headers = h;
  WL_ASSIGN_OR_RETURN(HttpResponse r, http.request(req));
  if (r.status != 200) {
    if (r.status == 404) return Status::NotFound("ModelScope model or revision not found: " + req.url);
    return status_from_response(r, req.url);
  }
  std::vector<MsFile> files;
  std::string error;
  auto parsed = parse_json_strict(r.body, &error);  // a repeated key is refused: one reading of the listing
  if (!parsed) return Status::Corrupt("unexpected ModelScope file list (" + error + ") from " + req.url);
  try {
    const json& j = *parsed;
    if (j.value("Code", 0) != 200)
      return Status::NotFound("ModelScope error for " + model_id + ": " + j.value("Message", ""));
    const json& list = j.at("Data").at("Files");
    if (list.size() > http.options().max_list_entries)
      return Status::OutOfRange(
          fmt::format("the ModelScope listing of {} holds more than {} entries "
                      "(WEIGHTLIFT_LIST_MAX_ENTRIES)",
                      model_id, http.options().max_list_entries));
    for (const auto& f : list) {
      if (f.value("Type", "blob") == "tree") continue;
      WL_ASSIGN_OR_RETURN(MsFile m, parse_entry(f, req.url));
      files.push_back(std::move(m));
    }
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("unexpected ModelScope file list (") + e.what() + ") from " + req.url);
  }
  return files;
}

// {cache}/.weightlift/verified/{sha256(folder)}.json: for each file of the folder, the version
// ("dev:ino:size:mtime_ns") whose bytes were last found to match which Sha256.
class VerifiedSidecar {
 public:
  VerifiedSidecar(Env* env, const std::string& cache, const std::string& folder)
      : env_(env), path_(cache + "/.weightlift/verified/" + sha256_hex(folder) + ".json") {
    auto text = read_file_to_string(path_, 64 << 20, env);
    if (!text.ok()) return;
    auto parsed = parse_json_strict(*text, nullptr);
    if (!parsed) return;  // unreadable or a repeated key: every file is hashed once more
    try {
      const json& j = *parsed;
      for (const auto& [rel, e] : j.at("files").items())
        entries_[rel] = {e.at("version").get<std::string>(), e.at("sha256").get<std::string>()};
    } catch (const std::exception&) {
      entries_.clear();  // unreadable: every file is hashed once more
    }
  }
  bool vouches(const std::string& rel, const std::string& version, const std::string& sha256) const {
    auto it = entries_.find(rel);
    return !version.empty() && it != entries_.end() && it->second.first == version && it->second.second == sha256;
  }
  void record(const std::string& rel, const std::string& version, const std::string& sha256) {
    entries_[rel] = {version, sha256};
    dirty_ = true;
  }
  Status save() {
    if (!dirty_) return Status();
    json files = json::object();
    for (const auto& [rel, e] : entries_) files[rel] = {{"version", e.first}, {"sha256", e.second}};
    WL_RETURN_IF_ERROR(env_->create_dirs(parent_dir(path_)));
    return write_file_atomic(path_, json{{"format_version", 1}, {"files", files}}.dump(), env_);
  }

 private:
  Env* env_;
  std::string path_;
  std::map<std::string, std::pair<std::string, std::string>> entries_;
  bool dirty_ = false;
};

// The SHA-256 of a local file, read in 4 MiB blocks.
Result<std::string> hash_file(RandomAccessFile& f) {
  Sha256 h;
  std::vector<std::byte> buf(std::min<uint64_t>(f.size(), 4 << 20));
  for (uint64_t off = 0; off < f.size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), f.size() - off));
    WL_RETURN_IF_ERROR(f.read_at(off, std::span(buf.data(), n)));
    h.update(std::span<const std::byte>(buf.data(), n));
    off += n;
  }
  return h.hex_digest();
}

// Whether the file already at `dest` holds the listed bytes: its size, then its Sha256 (remembered in
// the sidecar for its version, else hashed once). A stale file is logged and fetched again.
Result<bool> already_there(Env* env, const std::string& dest, const MsFile& f, VerifiedSidecar& sidecar,
                           const HubOptions& o) {
  if (!env->exists(dest)) return false;
  WL_ASSIGN_OR_RETURN(auto file, env->open(dest, {.mode = FileMode::kPread}));
  if (file->size() != f.size) return false;
  if (f.sha256.empty() || !verify_downloads()) {
    if (o.log)
      o.log(fmt::format("warning: {}: kept by its size, NOT verified ({})", dest,
                        f.sha256.empty() ? "ModelScope lists no Sha256" : "WEIGHTLIFT_VERIFY=0"));
    return true;
  }
  const std::string version = file->version();
  if (sidecar.vouches(f.path, version, f.sha256)) return true;
  WL_ASSIGN_OR_RETURN(std::string got, hash_file(*file));
  if (got == f.sha256) {
    sidecar.record(f.path, version, f.sha256);
    return true;
  }
  if (o.log)
    o.log(fmt::format("{} is stale (its SHA-256 is {}, ModelScope lists {}): fetching it again", dest, got, f.sha256));
  return false;
}

// One file, streamed into a temporary beside `dest`, hashed as it arrives, renamed into place only
// when its size and Sha256 are the listed ones.
Status fetch_file(HttpClient& http, const HttpRequest& g, const std::string& dest, const MsFile& f, Env* env,
                  VerifiedSidecar& sidecar, const HubOptions& o) {
  WL_RETURN_IF_ERROR(env->create_dirs(parent_dir(dest)));
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(dest, 0644, env));
  Sha256 h;
  uint64_t got = 0;
  BodySink sink = [&](std::span<const std::byte> d) -> Status {
    got += d.size();
    if (got > f.size) return Status::Corrupt("ModelScope sent more bytes than listed for " + f.path);
    h.update(d);
    return out.append(d);
  };
  WL_ASSIGN_OR_RETURN(HttpResponse gr, http.get(g, sink));
  if (gr.status != 200) return status_from_response(gr, g.url);
  if (got != f.size)
    return Status::Corrupt(fmt::format("ModelScope download of {} ended at {} of {} bytes", f.path, got, f.size))
        .with_file(dest);
  const std::string sha = h.hex_digest();
  const bool check = !f.sha256.empty() && verify_downloads();
  if (check && sha != f.sha256)
    return Status::Corrupt(fmt::format("ModelScope download of {} does not match its Sha256 {} (got {}); nothing was "
                                       "written under its name",
                                       f.path, f.sha256, sha))
        .with_file(dest);
  WL_RETURN_IF_ERROR(out.commit());
  if (!check) {
    if (o.log)
      o.log(fmt::format("warning: {}: written atomically, NOT verified ({})", dest,
                        f.sha256.empty() ? "ModelScope lists no Sha256" : "WEIGHTLIFT_VERIFY=0"));
    return Status();
  }
  if (auto done = env->open(dest, {.mode = FileMode::kPread}); done.ok())
    sidecar.record(f.path, (*done)->version(), sha);
  return Status();
}

}  // namespace

Result<std::string> modelscope_snapshot_download(const std::string& model_id, const SnapshotOptions& s,
                                                 const HubOptions& o) {
  WL_RETURN_IF_ERROR(check_repo_id(model_id));
  if (model_id.find('/') == std::string::npos)
    return Status::InvalidArgument("ModelScope model ids are 'owner/name': '" + model_id + "'");
  const std::string revision = s.revision.empty() ? "master" : s.revision;
  WL_RETURN_IF_ERROR(check_revision(revision));  // before it becomes a path, as the Hub's
  Env* env = hub_env(o);
  const std::string cache = modelscope_cache(o);
  env->confine_writes(cache);
  const std::string owner = model_id.substr(0, model_id.find('/')), name = model_id.substr(model_id.find('/') + 1);
  const std::string folder = modelscope_folder(env, cache, owner, name, revision);
  if (hub_offline(o)) {
    if (has_entries(env, folder)) return folder;
    return Status::NotFound("ModelScope model " + model_id + " (revision " + revision +
                            ") is not in the local cache and offline mode is on")
        .with_file(folder);
  }
  HttpClient http(o.http);
  std::vector<std::pair<std::string, std::string>> headers;
  auto token = std::getenv("MODELSCOPE_API_TOKEN");
  if (token && *token) {
    WL_RETURN_IF_ERROR(check_secret(token, "MODELSCOPE_API_TOKEN"));
    headers.emplace_back("Authorization", std::string("Bearer ") + token);
  }
  const std::string base = modelscope_endpoint(o) + "/api/v1/models/" + model_id;
  WL_ASSIGN_OR_RETURN(std::vector<MsFile> files, list_files(http, headers, base, model_id, revision));
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.path);
  auto keep = filter_repo_files(names, s.allow_patterns, s.ignore_patterns);
  std::set<std::string> keep_set(keep.begin(), keep.end());
  WL_RETURN_IF_ERROR(env->create_dirs(folder));
  VerifiedSidecar sidecar(env, cache, folder);
  // What is missing or stale, admitted against the free disk before a byte is written.
  std::vector<const MsFile*> fetch;
  uint64_t total = 0;
  for (const auto& f : files) {
    if (!keep_set.count(f.path)) continue;
    WL_ASSIGN_OR_RETURN(bool there, already_there(env, folder + "/" + f.path, f, sidecar, o));
    if (there) continue;
    fetch.push_back(&f);
    if (!checked_add(total, f.size, &total))
      return Status::OutOfRange(fmt::format("the sizes ModelScope lists for {} add up past 2^64 bytes", model_id));
  }
  if (auto room = free_disk_bytes(folder); room && total > *room)
    return Status::OutOfRange(
        fmt::format("cannot download {} from ModelScope: its files are listed at {} bytes, more "
                    "than the {} bytes free on the disk of {}; nothing was written",
                    model_id, total, *room, folder));
  Status st;
  for (const MsFile* f : fetch) {
    HttpRequest g;
    g.url = base + "/repo?Revision=" + url_quote(revision, false) + "&FilePath=" + url_quote(f->path, true);
    g.headers = headers;
    st = fetch_file(http, g, folder + "/" + f->path, *f, env, sidecar, o);
    if (!st.ok()) break;
  }
  if (Status saved = sidecar.save(); !saved.ok() && o.log)
    o.log("could not remember the verified files (ignored): " + saved.to_string());
  WL_RETURN_IF_ERROR(st);
  return folder;
}

}  // namespace wl

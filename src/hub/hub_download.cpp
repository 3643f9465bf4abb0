// The Hub protocol (repo info, tree, resolve HEAD) and the cache writer:
// refs, the tree listing (trees/{commit}.json), snapshot pointers, CACHEDIR.TAG,
// all written through the Env. Blobs themselves: hub_blob.cpp.
#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/runs.h"
#include "hub/hub_internal.h"
#include "util/json_strict.h"
#include "weightlift/io.h"
#include "weightlift/progress.h"

namespace wl {

std::vector<std::pair<std::string, std::string>> HubCtx::headers(bool auth) const {
  std::vector<std::pair<std::string, std::string>> h{{"Accept-Encoding", "identity"}};
  if (auth && token) h.emplace_back("Authorization", "Bearer " + *token);
  return h;
}

void HubCtx::add_progress(uint64_t n) {
  uint64_t now = done_bytes += n;
  if (!bar) return;
  std::lock_guard<std::mutex> lock(progress_mu);
  bar->update(now);
}

namespace {

using json = nlohmann::json;

std::string normalize_etag(std::string e) {
  if (e.starts_with("W/")) e = e.substr(2);
  while (!e.empty() && e.front() == '"') e.erase(e.begin());
  while (!e.empty() && e.back() == '"') e.pop_back();
  return e;
}

std::string type_plural(const HubOptions& o) { return o.repo_type + "s"; }

std::string resolve_url(const HubOptions& o, const std::string& repo_id, const std::string& rev,
                        const std::string& file) {
  std::string prefix = o.repo_type == "model" ? "" : "/" + type_plural(o);
  return hub_endpoint(o) + prefix + "/" + repo_id + "/resolve/" + url_quote(rev, false) + "/" + url_quote(file, true);
}

// status_from_response, with the repository and revision named in the message
// itself for the errors that are about them.
Status hub_error(const HttpResponse& r, const std::string& url, const std::string& repo_id,
                 const std::string& revision) {
  Status s = status_from_response(r, url);
  switch (classify_hub_error(r)) {
    case HubErrorKind::kRevisionNotFound:
      return Status::NotFound(fmt::format("revision not found: '{}' is not a branch, tag or commit of {} ({})",
                                          revision, repo_id, s.message()));
    case HubErrorKind::kRepoNotFound:
      return Status::NotFound(fmt::format("repository not found: {} ({})", repo_id, s.message()));
    default: return s;
  }
}

Result<json> get_json(HubCtx& c, const std::string& url, const std::string& repo_id, const std::string& revision,
                      HttpResponse* out = nullptr, std::chrono::steady_clock::time_point deadline = {}) {
  HttpRequest req;
  req.url = url;
  req.headers = c.headers(true);
  req.deadline = deadline;
  WL_ASSIGN_OR_RETURN(HttpResponse r, c.http.request(req));
  if (r.status != 200) return hub_error(r, url, repo_id, revision);
  std::string error;
  auto j = parse_json_strict(r.body, &error);  // a repeated key is refused: one reading of every listing
  if (!j) return Status::Corrupt("malformed JSON from the Hub (" + error + ") for " + url.substr(0, url.find('?')));
  if (out) *out = std::move(r);
  return std::move(*j);
}

Status write_small_file(Env* env, const std::string& path, const std::string& text) {
  WL_RETURN_IF_ERROR(env->create_dirs(parent_dir(path)));
  return write_file_atomic(path, text, env);
}

Status write_ref(Env* env, const std::string& storage, const std::string& revision, const std::string& commit) {
  if (revision == commit) return Status();
  std::string path = storage + "/refs/" + revision;
  auto cur = read_file_to_string(path, 4096, env);
  if (cur.ok() && *cur == commit) return Status();
  return write_small_file(env, path, commit);
}

std::optional<std::string> read_ref(Env* env, const std::string& storage, const std::string& revision) {
  if (is_commit_hash(revision)) return revision;
  auto cur = read_file_to_string(storage + "/refs/" + revision, 4096, env);
  if (!cur.ok() || !is_commit_hash(*cur)) return std::nullopt;
  return *cur;
}

// huggingface_hub 2.x tags the cache root for backup tools (the Cache Directory Tagging Standard).
void write_cachedir_tag(HubCtx& c) {
  const std::string tag = c.cache + "/CACHEDIR.TAG";
  if (c.env->exists(tag)) return;
  (void)c.env->create_dirs(c.cache);
  (void)write_file_atomic(tag,
                          "Signature: 8a477f597d28d172789f06886806bc55\n"
                          "# This file is a cache directory tag created by huggingface_hub.\n"
                          "# For information about cache directory tags, see:\n"
                          "#\thttps://bford.info/cachedir/\n",
                          c.env);
}

// ---- the tree listing huggingface_hub 2.x keeps: {storage}/trees/{commit}.json --------
// {"format_version": 1, "files": {path: {"size", "blob_id"[, "lfs_sha256", "lfs_size"][, "xet_hash"]}}},
// written as Python's json.dump(indent=1) writes it. Offline, it tells whether a snapshot is complete.

struct TreeFile {
  uint64_t size = 0;
  std::string blob_id, lfs_sha256, xet_hash;
  uint64_t lfs_size = 0;
  std::string etag() const { return lfs_sha256.empty() ? blob_id : lfs_sha256; }
};
using Tree = std::map<std::string, TreeFile>;

std::string tree_path(const std::string& storage, const std::string& commit) {
  return storage + "/trees/" + commit + ".json";
}

std::optional<Tree> read_tree_cache(Env* env, const std::string& storage, const std::string& commit) {
  auto text = read_file_to_string(tree_path(storage, commit), 256ull << 20, env);
  if (!text.ok()) return std::nullopt;
  auto parsed = parse_json_strict(*text, nullptr);
  if (!parsed) return std::nullopt;  // corrupt, repeats a key, or another format: listed again
  try {
    const json& j = *parsed;
    if (!j.is_object() || j.value("format_version", 0) != 1) return std::nullopt;
    Tree t;
    for (const auto& [path, info] : j.at("files").items()) {
      TreeFile f;
      f.size = info.at("size").get<uint64_t>();
      f.blob_id = info.at("blob_id").get<std::string>();
      if (info.contains("lfs_sha256") && info["lfs_sha256"].is_string()) {
        f.lfs_sha256 = info["lfs_sha256"].get<std::string>();
        f.lfs_size = info.value("lfs_size", f.size);
      }
      if (info.contains("xet_hash") && info["xet_hash"].is_string()) f.xet_hash = info["xet_hash"].get<std::string>();
      if (!check_repo_path(path).ok()) return std::nullopt;
      t[path] = std::move(f);
    }
    return t;
  } catch (const std::exception&) {
    return std::nullopt;  // corrupt or another format: listed again
  }
}

void write_tree_cache(HubCtx& c, const std::string& storage, const std::string& commit, const Tree& tree) {
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  for (const auto& [path, f] : tree) {  // std::map: sorted, as json.dump(sorted(...))
    nlohmann::ordered_json e = {{"size", f.size}, {"blob_id", f.blob_id}};
    if (!f.lfs_sha256.empty()) e["lfs_sha256"] = f.lfs_sha256, e["lfs_size"] = f.lfs_size;
    if (!f.xet_hash.empty()) e["xet_hash"] = f.xet_hash;
    files[path] = std::move(e);
  }
  nlohmann::ordered_json j = {{"format_version", 1}, {"files", std::move(files)}};
  Status s = write_small_file(c.env, tree_path(storage, commit), j.dump(1, ' ', /*ensure_ascii=*/true));
  if (!s.ok()) c.log("could not write the tree listing (ignored): " + s.to_string());
}

Result<Tree> fetch_tree(HubCtx& c, const std::string& repo_id, const std::string& commit) {
  const std::string storage = c.storage(repo_id);
  if (auto cached = read_tree_cache(c.env, storage, commit)) return *cached;
  WL_ASSIGN_OR_RETURN(auto entries, list_repo_tree(repo_id, commit, "", /*recursive=*/true, c.o));
  Tree t;
  for (auto& e : entries) {
    if (e.is_dir) continue;
    WL_RETURN_IF_ERROR(check_repo_path(e.path));
    TreeFile f;
    f.size = e.size;
    f.blob_id = e.oid;
    f.lfs_sha256 = e.lfs_sha256;
    if (!f.lfs_sha256.empty()) f.lfs_size = e.size;
    t[e.path] = std::move(f);
  }
  write_tree_cache(c, storage, commit, t);
  return t;
}

std::string join_patterns(const std::vector<std::string>& ps) {
  std::string out = "[";
  for (size_t i = 0; i < ps.size(); ++i) out += (i ? ", '" : "'") + ps[i] + "'";
  return out + "]";
}

// Offline (or with the Hub out of reach): the cached snapshot for `revision`,
// refused when its tree listing shows that selected files are missing (a
// download that stopped part way), as huggingface_hub 2.x refuses it.
Result<std::string> cached_snapshot(HubCtx& c, const std::string& repo_id, const std::string& revision,
                                    const SnapshotOptions& s, const Status& why) {
  const std::string storage = c.storage(repo_id);
  auto commit = read_ref(c.env, storage, revision);
  const std::string reason = why.ok() ? "offline mode is on (HF_HUB_OFFLINE or --offline)"
                                      : "the Hub could not be reached (" + why.message() + ")";
  if (!commit || !c.env->is_directory(storage + "/snapshots/" + *commit)) {
    if (!why.ok() && !hub_offline(c.o)) return why;
    return Status::NotFound(
        fmt::format("snapshot of {} at revision {} is not in the local cache and {}", repo_id, revision, reason));
  }
  const std::string folder = storage + "/snapshots/" + *commit;
  if (auto tree = read_tree_cache(c.env, storage, *commit)) {
    std::vector<std::string> names;
    for (const auto& [p, _] : *tree) names.push_back(p);
    std::vector<std::string> missing;
    for (const auto& p : filter_repo_files(names, s.allow_patterns, s.ignore_patterns))
      if (!c.env->exists(folder + "/" + p)) missing.push_back(p);
    if (!missing.empty()) {
      std::string sample;
      for (size_t i = 0; i < missing.size() && i < 3; ++i) sample += (i ? ", " : "") + missing[i];
      if (missing.size() > 3) sample += fmt::format(", ... ({} more)", missing.size() - 3);
      return Status::NotFound(fmt::format(
          "the cached snapshot of {} (revision {}, commit {}) is incomplete: {} file(s) are missing ({}); {}. "
          "Run the download again with network access to complete it",
          repo_id, revision, *commit, missing.size(), sample, reason));
    }
  }
  return folder;
}

}  // namespace

Status link_pointer(HubCtx& c, const std::string& storage, const std::string& commit, const std::string& file,
                    const std::string& etag) {
  Env* env = c.env;
  const std::string pointer = storage + "/snapshots/" + commit + "/" + file;
  if (env->exists(pointer)) return Status();  // a pointer of a commit names one blob
  WL_RETURN_IF_ERROR(env->create_dirs(parent_dir(pointer)));
  std::string target = "../../";
  for (char ch : file)
    if (ch == '/') target += "../";
  target += "blobs/" + etag;
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.wl-link-{}", pointer,
                                      counter.fetch_add(1) ^ std::hash<std::thread::id>{}(std::this_thread::get_id()));
  (void)env->remove(tmp);
  WL_RETURN_IF_ERROR(env->symlink(target, tmp));
  if (Status s = env->rename(tmp, pointer); !s.ok()) {
    (void)env->remove(tmp);
    return s;
  }
  return Status();
}

Status vouch_from_listing(FileMeta& m, const std::string& lfs_sha256, const std::string& git_oid) {
  auto contradicts = [&](const char* field, const std::string& listed) {
    return Status::Corrupt(
        fmt::format("the Hub contradicts itself about {} of {} (revision {}): its ETag says {} but its tree listing's "
                    "{} is {}; nothing was downloaded",
                    m.path, m.repo_id, m.revision, m.hash_hex, field, listed));
  };
  if (is_hex_of(lfs_sha256, 64)) {  // an LFS file: its SHA-256, whatever the ETag looks like
    if (m.hash == HashKind::kSha256 && m.hash_hex != lfs_sha256) return contradicts("lfs.oid", lfs_sha256);
    m.hash = HashKind::kSha256;
    m.hash_hex = lfs_sha256;
    return Status();
  }
  if (!lfs_sha256.empty() || !is_hex_of(git_oid, 40)) return Status();  // nothing usable listed
  if (m.hash == HashKind::kGitSha1 && m.hash_hex != git_oid) return contradicts("oid", git_oid);
  if (m.hash == HashKind::kNone) m.hash = HashKind::kGitSha1, m.hash_hex = git_oid;
  return Status();
}

Result<FileMeta> head_file(HubCtx& c, const std::string& repo_id, const std::string& revision, const std::string& file,
                           HttpResponse* error_response) {
  HttpRequest req;
  req.method = "HEAD";
  req.url = resolve_url(c.o, repo_id, revision, file);
  req.headers = c.headers(true);
  req.follow_redirects = false;
  WL_ASSIGN_OR_RETURN(HttpResponse r, c.http.request(req));
  if (r.status >= 400) {
    if (error_response) *error_response = r;
    return hub_error(r, req.url, repo_id, revision);
  }
  FileMeta m;
  m.repo_id = repo_id;
  m.revision = revision;
  m.path = file;
  m.commit = r.header("x-repo-commit");
  std::string linked = r.header("x-linked-etag");
  m.etag = normalize_etag(linked.empty() ? r.header("etag") : linked);
  const bool redirected = r.status >= 300 && r.status < 400 && !r.header("location").empty();
  m.location = redirected ? r.header("location") : r.url;
  if (m.location.find("://") == std::string::npos) m.location = r.url;  // relative: already followed
  if (!m.location.starts_with("http://") && !m.location.starts_with("https://"))
    return Status::InvalidArgument(
        fmt::format("refusing to download {} of {}: the server redirects it to a URL that is not http or https ({})",
                    file, repo_id, m.location.substr(0, std::min<size_t>(m.location.find_first_of("?#"), 200))));
  if (m.commit.empty() || !is_commit_hash(m.commit))
    return Status::Unavailable("the server's answer for " + req.url +
                               " has no valid X-Repo-Commit (not a Hub endpoint?)");
  if (!is_safe_etag(m.etag))
    return Status::Corrupt("the server's ETag for " + req.url + " is missing or unsafe as a file name: '" + m.etag +
                           "'");
  m.cross_host = url_origin(m.location) != url_origin(req.url);
  // The ETag vouches for the bytes only when it is a hash: SHA-256 (LFS), git's blob SHA-1 (the others).
  // An MD5-like or multipart ETag (a mirror, an S3-backed CDN) leaves it to the tree listing.
  if (is_hex_of(m.etag, 64)) m.hash = HashKind::kSha256, m.hash_hex = m.etag;
  if (is_hex_of(m.etag, 40)) m.hash = HashKind::kGitSha1, m.hash_hex = m.etag;
  std::string size = r.header("x-linked-size");
  if (size.empty() && redirected) {
    // A redirected file without X-Linked-Size (a regular file served elsewhere): the redirect's own
    // Content-Length is its (empty) body's, not the file's. Ask where the bytes are.
    HttpRequest at;
    at.method = "HEAD";
    at.url = m.location;
    at.headers = c.headers(!m.cross_host);
    WL_ASSIGN_OR_RETURN(HttpResponse there, c.http.request(at));
    if (there.status < 200 || there.status >= 300)
      return Status(status_from_response(there, m.location))
          .with_file(fmt::format("{} of {} (revision {})", file, repo_id, revision));
    size = there.header("content-length");
  } else if (size.empty()) {
    size = r.header("content-length");
  }
  if (size.empty() || size.find_first_not_of("0123456789") != std::string::npos || size.size() > 19)
    return Status::Corrupt("the server's answer for " + req.url + " has no usable size");
  m.size = std::stoull(size);
  return m;
}

// ---- public API ------------------------------------------------------------------

Result<RepoInfo> repo_info(const std::string& repo_id, const std::string& revision, const HubOptions& o) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  HubCtx c(o);
  WL_RETURN_IF_ERROR(c.token_status);
  std::string url =
      hub_endpoint(o) + "/api/" + type_plural(o) + "/" + repo_id + "/revision/" + url_quote(revision, false);
  WL_ASSIGN_OR_RETURN(json j, get_json(c, url, repo_id, revision));
  RepoInfo info;
  try {
    if (!j.is_object() || !j.contains("sha") || !j["sha"].is_string())
      return Status::Corrupt("repository info without a commit sha from " + url);
    info.sha = j["sha"].get<std::string>();
    if (!is_commit_hash(info.sha)) return Status::Corrupt("repository info has an invalid commit sha from " + url);
    if (j.contains("siblings") && j["siblings"].is_array())
      for (const auto& s : j["siblings"])
        if (s.is_object() && s.contains("rfilename") && s["rfilename"].is_string())
          info.files.push_back(s["rfilename"].get<std::string>());
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("unexpected repository info (") + e.what() + ") from " + url);
  }
  return info;
}

Result<std::vector<RepoEntry>> list_repo_tree(const std::string& repo_id, const std::string& revision,
                                              const std::string& path_in_repo, bool recursive, const HubOptions& o) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  HubCtx c(o);
  WL_RETURN_IF_ERROR(c.token_status);
  std::string url = hub_endpoint(o) + "/api/" + type_plural(o) + "/" + repo_id + "/tree/" + url_quote(revision, false) +
                    (path_in_repo.empty() ? "" : "/" + url_quote(path_in_repo, true)) +
                    "?recursive=" + (recursive ? "True" : "False") + "&expand=False";
  std::vector<RepoEntry> out;
  std::set<std::string> seen_pages;
  const HttpOptions& lim = c.http.options();
  int empty = 0;  // empty pages in a row that link to another
  const auto deadline = listing_deadline(lim);
  for (uint64_t page = 0; !url.empty(); ++page) {
    if (page >= lim.max_list_pages)
      return Status::OutOfRange(fmt::format("tree listing of {} did not end after {} pages (WEIGHTLIFT_LIST_MAX_PAGES)",
                                            repo_id, lim.max_list_pages));
    WL_RETURN_IF_ERROR(listing_overdue(lim, deadline, "the tree listing of " + repo_id, page, out.size()));
    if (!seen_pages.insert(url).second)
      return Status::Corrupt("tree pagination of " + repo_id + " does not end (a page links back to an earlier one)");
    HttpResponse resp;
    auto got = get_json(c, url, repo_id, revision, &resp, deadline);
    if (!got.ok()) {  // the listing's own time, when that is what ended the request
      WL_RETURN_IF_ERROR(listing_overdue(lim, deadline, "the tree listing of " + repo_id, page, out.size()));
      return std::move(got).status();
    }
    json j = std::move(*got);
    if (!j.is_array()) return Status::Corrupt("tree listing is not a JSON array from " + url);
    if (out.size() + j.size() > lim.max_list_entries)
      return Status::OutOfRange(
          fmt::format("tree listing of {} holds more than {} entries (WEIGHTLIFT_LIST_MAX_ENTRIES)", repo_id,
                      lim.max_list_entries));
    try {
      for (const auto& e : j) {
        RepoEntry r;
        r.path = e.at("path").get<std::string>();
        r.is_dir = e.value("type", "file") == "directory";
        r.size = e.value("size", uint64_t{0});
        r.oid = e.value("oid", "");
        if (e.contains("lfs") && e["lfs"].is_object()) r.lfs_sha256 = e["lfs"].value("oid", "");
        out.push_back(std::move(r));
      }
    } catch (const std::exception& ex) {
      return Status::Corrupt(std::string("unexpected tree entry (") + ex.what() + ") from " + url);
    }
    // Link: <url>; rel="next" (possibly among other links)
    std::string link = resp.header("link");
    std::string next;
    auto rel = link.find("rel=\"next\"");
    if (rel != std::string::npos) {
      auto lt = link.rfind('<', rel), gt = link.find('>', lt == std::string::npos ? 0 : lt);
      if (lt != std::string::npos && gt != std::string::npos && gt < rel) next = link.substr(lt + 1, gt - lt - 1);
    }
    if (!next.empty() && url_origin(next) != url_origin(url))
      return Status::Corrupt("tree pagination points to another host: " + next.substr(0, next.find('?')));
    empty = !next.empty() && j.empty() ? empty + 1 : 0;
    if (empty >= 3)
      return Status::Corrupt(
          fmt::format("tree pagination of {} sent {} empty pages in a row, each linking to another", repo_id, empty));
    url = next;
  }
  return out;
}

namespace {

// The vouched hash of a file whose ETag is no hash, from its folder's listing (what huggingface_hub's
// paths-info gives). A listing that fails leaves it unverified (logged).
Status vouch_from_folder_listing(HubCtx& c, FileMeta& m) {
  const auto slash = m.path.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : m.path.substr(0, slash);
  auto entries = list_repo_tree(m.repo_id, m.commit, folder, /*recursive=*/false, c.o);
  if (!entries.ok()) {
    c.log(fmt::format("cannot list {} of {} for its hash ({})", folder.empty() ? "the root" : folder, m.repo_id,
                      entries.status().to_string()));
    return Status();
  }
  for (const auto& e : *entries)
    if (!e.is_dir && e.path == m.path) return vouch_from_listing(m, e.lfs_sha256, e.oid);
  return Status();
}

Result<std::string> hf_hub_download_impl(const std::string& repo_id, const std::string& filename,
                                         const std::string& revision, const HubOptions& o,
                                         const std::string& subfolder) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  WL_RETURN_IF_ERROR(check_revision(revision));
  const std::string file = subfolder.empty() ? filename : subfolder + "/" + filename;
  WL_RETURN_IF_ERROR(check_repo_path(file));
  HubCtx c(o);
  WL_RETURN_IF_ERROR(c.token_status);
  Env* env = c.env;
  const std::string storage = c.storage(repo_id);
  auto pointer = [&](const std::string& commit) { return storage + "/snapshots/" + commit + "/" + file; };
  if (is_commit_hash(revision) && env->exists(pointer(revision))) return pointer(revision);
  auto from_cache = [&](const Status& why) -> Result<std::string> {
    auto commit = read_ref(env, storage, revision);
    if (commit && env->exists(pointer(*commit))) return pointer(*commit);
    if (commit && env->exists(storage + "/.no_exist/" + *commit + "/" + file))
      return Status::NotFound("entry not found: " + repo_id + "/" + file + " (cached as missing at " + *commit + ")");
    if (hub_offline(o))
      return Status::NotFound(fmt::format(
          "{} of {} at revision {} is not in the local cache and offline mode is on (HF_HUB_OFFLINE or --offline)",
          file, repo_id, revision));
    return why;
  };
  if (hub_offline(o)) return from_cache(Status());
  HttpResponse err;
  auto meta = head_file(c, repo_id, revision, file, &err);
  if (!meta.ok()) {
    HubErrorKind kind = classify_hub_error(err);
    if (kind == HubErrorKind::kEntryNotFound) {
      std::string commit = err.header("x-repo-commit");
      if (is_commit_hash(commit)) {
        (void)write_small_file(env, storage + "/.no_exist/" + commit + "/" + file, "");
        (void)write_ref(env, storage, revision, commit);
      }
      return std::move(meta).status();
    }
    if (kind == HubErrorKind::kRevisionNotFound) return std::move(meta).status();
    return from_cache(meta.status());  // network down, Hub failing, gated...: the cache may serve
  }
  WL_RETURN_IF_ERROR(write_ref(env, storage, revision, meta->commit));
  if (env->exists(pointer(meta->commit))) return pointer(meta->commit);
  if (meta->hash == HashKind::kNone) WL_RETURN_IF_ERROR(vouch_from_folder_listing(c, *meta));
  write_cachedir_tag(c);
  if (c.o.progress) c.bar = std::make_unique<ProgressBar>("Downloading " + file, meta->size, true, stderr, "B");
  WL_RETURN_IF_ERROR(fetch_blob(c, *meta));
  if (c.bar) c.bar->finish();
  WL_RETURN_IF_ERROR(link_pointer(c, storage, meta->commit, file, meta->etag));
  return pointer(meta->commit);
}

}  // namespace

Result<std::string> hf_hub_download(const std::string& repo_id, const std::string& filename,
                                    const std::string& revision, const HubOptions& o, const std::string& subfolder) {
  try {  // the API boundary: an allocation that fails is an error
    return hf_hub_download_impl(repo_id, filename, revision, o, subfolder);
  } catch (const std::bad_alloc&) {
    return Status::OutOfRange(fmt::format("out of memory downloading {} of {}", filename, repo_id));
  }
}

Result<SnapshotPlan> snapshot_download_except(const std::string& repo_id, const SnapshotOptions& s, const HubOptions& o,
                                              const std::function<bool(const std::string&)>& defer) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  const std::string revision = s.revision.empty() ? "main" : s.revision;
  WL_RETURN_IF_ERROR(check_revision(revision));
  HubCtx c(o);
  WL_RETURN_IF_ERROR(c.token_status);
  Env* env = c.env;
  const std::string storage = c.storage(repo_id);
  auto offline_plan = [&](const Status& why) -> Result<SnapshotPlan> {
    WL_ASSIGN_OR_RETURN(std::string folder, cached_snapshot(c, repo_id, revision, s, why));
    SnapshotPlan p;
    p.folder = folder;
    p.commit = base_name(folder);
    return p;
  };
  if (hub_offline(o)) return offline_plan(Status());
  // The commit (a commit hash needs no lookup), then its tree listing (cached per commit).
  std::string commit = is_commit_hash(revision) ? revision : "";
  if (commit.empty()) {
    auto info = repo_info(repo_id, revision, o);
    if (!info.ok()) {
      const Status& st = info.status();
      if (st.message().starts_with("revision not found") || st.code() == Code::kCorruptData) return st;
      return offline_plan(st);
    }
    commit = info->sha;
  }
  Result<Tree> tree = fetch_tree(c, repo_id, commit);
  if (!tree.ok()) {
    const Status& st = tree.status();
    if (st.message().starts_with("revision not found") || st.code() == Code::kCorruptData ||
        st.code() == Code::kInvalidArgument)
      return st;
    return offline_plan(st);
  }
  std::vector<std::string> names;
  for (const auto& [p, _] : *tree) names.push_back(p);
  std::vector<std::string> files = filter_repo_files(names, s.allow_patterns, s.ignore_patterns);
  if (!names.empty() && files.empty() && (!s.allow_patterns.empty() || !s.ignore_patterns.empty())) {
    std::string which;
    if (!s.allow_patterns.empty()) which += "allow_patterns=" + join_patterns(s.allow_patterns);
    if (!s.ignore_patterns.empty())
      which += (which.empty() ? "" : ", ") + ("ignore_patterns=" + join_patterns(s.ignore_patterns));
    c.log(fmt::format("warning: No files matched {} in {} (revision {})", which, repo_id, revision));
  }
  WL_RETURN_IF_ERROR(write_ref(env, storage, revision, commit));
  SnapshotPlan plan;
  plan.commit = commit;
  plan.folder = storage + "/snapshots/" + commit;
  WL_RETURN_IF_ERROR(env->create_dirs(plan.folder));
  write_cachedir_tag(c);
  // Phase 1: metadata (a HEAD per file not yet in the snapshot), in parallel.
  std::vector<std::string> missing;
  for (const auto& f : files)
    if (!env->exists(plan.folder + "/" + f)) missing.push_back(f);
  std::vector<std::optional<FileMeta>> metas(missing.size());
  const int workers = std::max(1, o.max_workers);
  Status headed = run_each_until_error(missing.size(), workers, [&](size_t, size_t k) -> Status {
    WL_ASSIGN_OR_RETURN(FileMeta m, head_file(c, repo_id, commit, missing[k], nullptr));
    m.revision = revision;  // messages name the revision asked for
    const TreeFile& listed = tree->at(missing[k]);
    WL_RETURN_IF_ERROR(vouch_from_listing(m, listed.lfs_sha256, listed.blob_id));
    metas[k] = std::move(m);
    return Status();
  });
  WL_RETURN_IF_ERROR(headed);
  // Phase 2: bytes, largest files first (they take the longest); deferred files are left to the caller.
  std::vector<size_t> order;
  uint64_t total = 0;
  for (size_t k = 0; k < missing.size(); ++k) {
    if (defer && defer(missing[k]) && !blob_present(env, storage + "/blobs/" + metas[k]->etag)) {
      plan.deferred.push_back(*metas[k]);
      continue;
    }
    order.push_back(k);
    if (!blob_present(env, storage + "/blobs/" + metas[k]->etag)) total += metas[k]->size;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return metas[a]->size > metas[b]->size; });
  if (o.progress && total > 0)
    c.bar =
        std::make_unique<ProgressBar>("Fetching " + std::to_string(order.size()) + " files", total, true, stderr, "B");
  Status fetched = run_each_until_error(order.size(), workers, [&](size_t, size_t i) -> Status {
    const FileMeta& m = *metas[order[i]];
    WL_RETURN_IF_ERROR(fetch_blob(c, m));
    return link_pointer(c, storage, commit, m.path, m.etag);
  });
  if (c.bar) c.bar->finish();
  WL_RETURN_IF_ERROR(fetched);
  return plan;
}

Result<std::string> snapshot_download(const std::string& repo_id, const SnapshotOptions& s, const HubOptions& o) {
  try {  // the API boundary: an allocation that fails is an error
    WL_ASSIGN_OR_RETURN(SnapshotPlan plan, snapshot_download_except(repo_id, s, o, {}));
    return plan.folder;
  } catch (const std::bad_alloc&) {
    return Status::OutOfRange("out of memory downloading " + repo_id);
  }
}

}  // namespace wl

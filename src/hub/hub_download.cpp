// The Hub protocol (repo info, tree, resolve HEAD/GET) and the cache writer.
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "hub/hub_internal.h"
#include "weightlift/lock.h"
#include "io/unique_fd.h"
#include "weightlift/io.h"
#include "weightlift/progress.h"

namespace wl {
namespace {

using json = nlohmann::json;

// SHA-256 or git-blob SHA-1, chosen by the ETag's length.
class BlobHasher {
 public:
  BlobHasher(const std::string& etag, uint64_t size) : ctx_(EVP_MD_CTX_new()) {
    kind_ = etag.size() == 64 ? 256 : etag.size() == 40 ? 1 : 0;
    if (kind_ == 256) EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr);
    if (kind_ == 1) {
      EVP_DigestInit_ex(ctx_, EVP_sha1(), nullptr);
      std::string prefix = "blob " + std::to_string(size);
      EVP_DigestUpdate(ctx_, prefix.data(), prefix.size() + 1);  // with the NUL
    }
  }
  ~BlobHasher() { EVP_MD_CTX_free(ctx_); }
  BlobHasher(const BlobHasher&) = delete;
  BlobHasher& operator=(const BlobHasher&) = delete;
  void update(const void* p, size_t n) {
    if (kind_) EVP_DigestUpdate(ctx_, p, n);
  }
  bool verifiable() const { return kind_ != 0; }
  std::string hex() {
    if (!kind_) return {};
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, md, &n);
    static const char* hx = "0123456789abcdef";
    std::string out;
    for (unsigned i = 0; i < n; ++i) out += hx[md[i] >> 4], out += hx[md[i] & 15];
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
  int kind_ = 0;
};

std::string normalize_etag(std::string e) {
  if (e.starts_with("W/")) e = e.substr(2);
  while (!e.empty() && e.front() == '"') e.erase(e.begin());
  while (!e.empty() && e.back() == '"') e.pop_back();
  return e;
}

std::string type_plural(const HubOptions& o) { return o.repo_type + "s"; }

std::string resolve_url(const HubOptions& o, const std::string& repo_id, const std::string& rev, const std::string& file) {
  std::string prefix = o.repo_type == "model" ? "" : "/" + type_plural(o);
  return hub_endpoint(o) + prefix + "/" + repo_id + "/resolve/" + url_quote(rev, false) + "/" + url_quote(file, true);
}

// Shared state of one download call.
struct Ctx {
  const HubOptions& o;
  HttpClient http;
  std::optional<std::string> token;
  std::string cache;
  std::mutex progress_mu;
  std::unique_ptr<ProgressBar> bar;
  std::atomic<uint64_t> done_bytes{0};

  explicit Ctx(const HubOptions& opts) : o(opts), http(opts.http), token(hub_token(opts)), cache(hub_cache_dir(opts)) {}
  std::vector<std::pair<std::string, std::string>> headers(bool auth) const {
    std::vector<std::pair<std::string, std::string>> h{{"Accept-Encoding", "identity"}};
    if (auth && token) h.emplace_back("Authorization", "Bearer " + *token);
    return h;
  }
  void log(const std::string& line) const {
    if (o.log) o.log(line);
  }
  void add_progress(uint64_t n) {
    uint64_t now = done_bytes += n;
    if (!bar) return;
    std::lock_guard<std::mutex> lock(progress_mu);
    bar->update(now);
  }
};

Result<json> get_json(Ctx& c, const std::string& url, HttpResponse* out = nullptr) {
  HttpRequest req;
  req.url = url;
  req.headers = c.headers(true);
  WL_ASSIGN_OR_RETURN(HttpResponse r, c.http.request(req));
  if (r.status != 200) return status_from_response(r, url);
  try {
    json j = json::parse(r.body);
    if (out) *out = std::move(r);
    return j;
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("malformed JSON from the Hub (") + e.what() + ") for " + url.substr(0, url.find('?')));
  }
}

std::string storage_of(const Ctx& c, const std::string& repo_id) {
  return c.cache + "/" + repo_folder_name(repo_id, c.o.repo_type);
}

Status write_small_file(const std::string& path, const std::string& text) {
  WL_RETURN_IF_ERROR(make_dirs(path.substr(0, path.rfind('/'))));
  return write_file_atomic(path, text);
}

Status write_ref(const std::string& storage, const std::string& revision, const std::string& commit) {
  if (revision == commit) return Status::Ok();
  std::string path = storage + "/refs/" + revision;
  auto cur = read_file_to_string(path, 4096);
  if (cur.ok() && *cur == commit) return Status::Ok();
  return write_small_file(path, commit);
}

std::optional<std::string> read_ref(const std::string& storage, const std::string& revision) {
  if (is_commit_hash(revision)) return revision;
  auto cur = read_file_to_string(storage + "/refs/" + revision, 4096);
  if (!cur.ok() || !is_commit_hash(*cur)) return std::nullopt;
  return *cur;
}

bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// snapshots/{commit}/{file} -> ../../blobs/{etag} (one more ../ per folder level).
Status link_pointer(const std::string& storage, const std::string& commit, const std::string& file, const std::string& etag) {
  std::string pointer = storage + "/snapshots/" + commit + "/" + file;
  WL_RETURN_IF_ERROR(make_dirs(pointer.substr(0, pointer.rfind('/'))));
  std::string target = "../../";
  for (char ch : file)
    if (ch == '/') target += "../";
  target += "blobs/" + etag;
  char buf[4096];
  ssize_t n = ::readlink(pointer.c_str(), buf, sizeof buf);
  if (n > 0 && std::string(buf, static_cast<size_t>(n)) == target) return Status::Ok();
  std::string tmp = pointer + ".wl-link-" + std::to_string(::getpid()) + "-" +
                    std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  ::unlink(tmp.c_str());
  if (::symlink(target.c_str(), tmp.c_str()) != 0) return Status::FromErrno(errno, "cannot create symlink").with_file(tmp);
  if (::rename(tmp.c_str(), pointer.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Status::FromErrno(e, "cannot rename symlink").with_file(pointer);
  }
  return Status::Ok();
}

struct FileMeta {
  std::string etag, commit, location;
  uint64_t size = 0;
  bool cross_host = false;  // location is on another host: no token there
};

Result<FileMeta> head_file(Ctx& c, const std::string& repo_id, const std::string& revision, const std::string& file,
                           HttpResponse* error_response) {
  HttpRequest req;
  req.method = "HEAD";
  req.url = resolve_url(c.o, repo_id, revision, file);
  req.headers = c.headers(true);
  req.follow_redirects = false;
  WL_ASSIGN_OR_RETURN(HttpResponse r, c.http.request(req));
  if (r.status >= 400) {
    if (error_response) *error_response = r;
    return status_from_response(r, req.url);
  }
  FileMeta m;
  m.commit = r.header("x-repo-commit");
  std::string linked = r.header("x-linked-etag");
  m.etag = normalize_etag(linked.empty() ? r.header("etag") : linked);
  std::string size = r.header("x-linked-size");
  if (size.empty()) size = r.header("content-length");
  m.location = r.header("location").empty() ? r.url : r.header("location");
  if (m.location.find("://") == std::string::npos) m.location = r.url;  // relative: already followed
  if (m.commit.empty() || !is_commit_hash(m.commit))
    return Status::Unavailable("the server's answer for " + req.url + " has no valid X-Repo-Commit (not a Hub endpoint?)");
  if (!is_safe_etag(m.etag))
    return Status::Corrupt("the server's ETag for " + req.url + " is missing or unsafe as a file name: '" + m.etag + "'");
  if (size.empty() || size.find_first_not_of("0123456789") != std::string::npos || size.size() > 19)
    return Status::Corrupt("the server's answer for " + req.url + " has no usable size");
  m.size = std::stoull(size);
  m.cross_host = url_origin(m.location) != url_origin(req.url);
  return m;
}

Status verify_done(BlobHasher& h, const std::string& etag, const std::string& path, const std::string& url) {
  if (!h.verifiable()) return Status::Ok();
  std::string got = h.hex();
  if (got != etag)
    return Status::Corrupt("downloaded bytes do not match the ETag " + etag + " (got " + got + ") from " +
                           url.substr(0, url.find('?')))
        .with_file(path);
  return Status::Ok();
}

Status finish_blob(const std::string& from, const std::string& blob) {
  mode_t um = ::umask(0);
  ::umask(um);
  ::chmod(from.c_str(), 0666 & ~um);
  if (::rename(from.c_str(), blob.c_str()) != 0) return Status::FromErrno(errno, "cannot rename blob").with_file(blob);
  return Status::Ok();
}

// One stream into "{blob}.incomplete", resumed with Range (huggingface_hub's way).
Status fetch_single(Ctx& c, const FileMeta& m, const std::string& blob) {
  const std::string inc = blob + ".incomplete";
  UniqueFd fd(::open(inc.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return Status::FromErrno(errno, "cannot open").with_file(inc);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(inc);
  uint64_t have = static_cast<uint64_t>(st.st_size);
  if (have > m.size) {
    if (::ftruncate(fd.get(), 0) != 0) return Status::FromErrno(errno, "cannot truncate").with_file(inc);
    have = 0;
  }
  auto h = std::make_unique<BlobHasher>(m.etag, m.size);
  {  // hash what an earlier run left
    std::vector<char> buf(1 << 20);
    uint64_t off = 0;
    while (off < have) {
      ssize_t n = ::pread(fd.get(), buf.data(), std::min<uint64_t>(buf.size(), have - off), static_cast<off_t>(off));
      if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "cannot read partial download").with_file(inc);
      h->update(buf.data(), static_cast<size_t>(n));
      off += static_cast<uint64_t>(n);
    }
  }
  if (have) c.add_progress(have);
  int stalls = 0;
  const std::string where = m.location.substr(0, m.location.find('?'));
  while (have < m.size) {
    HttpRequest req;
    req.url = m.location;
    req.headers = c.headers(!m.cross_host);
    if (have > 0) {
      req.headers.emplace_back("Range", "bytes=" + std::to_string(have) + "-");
      req.expect_status = 206;
    }
    uint64_t pos = have;
    BodySink sink = [&](std::span<const std::byte> d) -> Status {
      if (pos + d.size() > m.size) return Status::Corrupt("server sent more bytes than the announced size of " + where);
      const char* p = reinterpret_cast<const char*>(d.data());
      size_t left = d.size();
      while (left) {
        ssize_t n = ::pwrite(fd.get(), p, left, static_cast<off_t>(pos));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "cannot write").with_file(inc);
        h->update(p, static_cast<size_t>(n));
        p += n, left -= static_cast<size_t>(n), pos += static_cast<uint64_t>(n);
      }
      c.add_progress(d.size());
      return Status::Ok();
    };
    uint64_t delivered = 0;
    auto r = c.http.get(req, sink, &delivered);
    if (r.ok() && r->status == 200 && have > 0) {
      // The server ignored the Range: start over from byte 0.
      if (::ftruncate(fd.get(), 0) != 0) return Status::FromErrno(errno, "cannot truncate").with_file(inc);
      h = std::make_unique<BlobHasher>(m.etag, m.size);
      have = 0;
      if (++stalls >= c.o.http.retry.max_attempts) return Status::Unavailable("server keeps ignoring Range requests: " + where);
      continue;
    }
    if (r.ok() && r->status >= 300) return status_from_response(*r, m.location);
    have = pos;
    if (have >= m.size) break;
    // The client already retried a request that got nothing; resume only after progress.
    if (!r.ok() && delivered == 0) return std::move(r).status().with_file(inc);
    if (r.ok() || r.status().code() == Code::kUnavailable) {
      if (delivered > 0) stalls = 0;
      if (delivered == 0 && ++stalls >= c.o.http.retry.max_attempts) {
        if (!r.ok()) return std::move(r).status().with_file(inc);
        return Status::Unavailable("download of " + where + " stopped at byte " + std::to_string(have) + " of " +
                                   std::to_string(m.size));
      }
      c.log("connection dropped at byte " + std::to_string(have) + "; resuming " + where);
      continue;
    }
    return std::move(r).status().with_file(inc);  // a local failure (disk full...): do not retry
  }
  if (have > m.size) return Status::Corrupt("more bytes than announced from " + where).with_file(inc);
  WL_RETURN_IF_ERROR(verify_done(*h, m.etag, inc, m.location));
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "cannot fsync").with_file(inc);
  fd.reset();
  return finish_blob(inc, blob);
}

// Parallel ranged requests into "{blob}.wlparts"; "{blob}.wlparts.done"
// lists finished chunks so that a killed download resumes where it was.
Status fetch_parallel(Ctx& c, const FileMeta& m, const std::string& blob) {
  const std::string parts = blob + ".wlparts";
  const std::string journal = parts + ".done";
  const uint64_t chunk = std::max<uint64_t>(c.o.chunk_bytes, 1 << 20);
  const uint64_t nchunks = (m.size + chunk - 1) / chunk;
  std::vector<char> done(nchunks, 0);
  UniqueFd fd(::open(parts.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return Status::FromErrno(errno, "cannot open").with_file(parts);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(parts);
  if (static_cast<uint64_t>(st.st_size) == m.size) {
    auto j = read_file_to_string(journal, 1 << 24);
    if (j.ok()) {
      std::istringstream in(*j);
      uint64_t cs = 0, idx = 0;
      if (in >> cs && cs == chunk)
        while (in >> idx)
          if (idx < nchunks) done[idx] = 1;
    }
  } else if (::ftruncate(fd.get(), static_cast<off_t>(m.size)) != 0) {
    return Status::FromErrno(errno, "cannot size").with_file(parts);
  }
  std::vector<uint64_t> todo;
  for (uint64_t i = 0; i < nchunks; ++i) {
    if (!done[i]) todo.push_back(i);
    else c.add_progress(std::min(chunk, m.size - i * chunk));
  }
  std::mutex mu;
  Status first_error;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto save_journal = [&]() -> Status {  // caller holds mu
    std::string text = std::to_string(chunk) + "\n";
    for (uint64_t i = 0; i < nchunks; ++i)
      if (done[i]) text += std::to_string(i) + "\n";
    return write_file_atomic(journal, text);
  };
  auto worker = [&] {
    for (;;) {
      size_t k = next++;
      if (k >= todo.size() || failed) return;
      const uint64_t idx = todo[k];
      const uint64_t begin = idx * chunk, end = std::min(m.size, begin + chunk);
      uint64_t pos = begin;
      int stalls = 0;
      Status err;
      while (pos < end) {
        HttpRequest req;
        req.url = m.location;
        req.headers = c.headers(!m.cross_host);
        req.headers.emplace_back("Range", "bytes=" + std::to_string(pos) + "-" + std::to_string(end - 1));
        req.expect_status = 206;
        BodySink sink = [&](std::span<const std::byte> d) -> Status {
          if (pos + d.size() > end) return Status::Corrupt("server sent more bytes than the requested range");
          const char* p = reinterpret_cast<const char*>(d.data());
          size_t left = d.size();
          while (left) {
            ssize_t n = ::pwrite(fd.get(), p, left, static_cast<off_t>(pos));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "cannot write").with_file(parts);
            p += n, left -= static_cast<size_t>(n), pos += static_cast<uint64_t>(n);
          }
          c.add_progress(d.size());
          return Status::Ok();
        };
        uint64_t delivered = 0;
        auto r = c.http.get(req, sink, &delivered);
        if (r.ok() && r->status != 206 && r->status < 300) {
          err = Status::Unavailable("server ignored a Range request for " + m.location.substr(0, m.location.find('?')));
          break;
        }
        if (r.ok() && r->status >= 300) {
          err = status_from_response(*r, m.location);
          break;
        }
        if (pos >= end) break;
        if (!r.ok() && (r.status().code() != Code::kUnavailable || delivered == 0)) {
          err = std::move(r).status();
          break;
        }
        if (delivered == 0 && ++stalls >= c.o.http.retry.max_attempts) {
          err = r.ok() ? Status::Unavailable("range download stalled at byte " + std::to_string(pos) + " of " +
                                             m.location.substr(0, m.location.find('?')))
                       : std::move(r).status();
          break;
        }
        if (delivered > 0) stalls = 0;
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!err.ok()) {
        if (first_error.ok()) first_error = std::move(err).with_file(parts);
        failed = true;
        return;
      }
      done[idx] = 1;
      Status s = save_journal();
      if (!s.ok() && first_error.ok()) first_error = s, failed = true;
    }
  };
  int nthreads = static_cast<int>(std::min<size_t>(std::max(1, c.o.connections_per_file), todo.size()));
  std::vector<std::thread> threads;
  for (int i = 1; i < nthreads; ++i) threads.emplace_back(worker);
  if (nthreads > 0) worker();
  for (auto& t : threads) t.join();
  if (!first_error.ok()) return first_error;
  BlobHasher h(m.etag, m.size);
  std::vector<char> buf(8 << 20);
  for (uint64_t off = 0; off < m.size;) {
    ssize_t n = ::pread(fd.get(), buf.data(), std::min<uint64_t>(buf.size(), m.size - off), static_cast<off_t>(off));
    if (n <= 0) return Status::FromErrno(n < 0 ? errno : EIO, "cannot read back").with_file(parts);
    h.update(buf.data(), static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  Status v = verify_done(h, m.etag, parts, m.location);
  if (!v.ok()) {
    ::unlink(journal.c_str());
    ::unlink(parts.c_str());
    return v;
  }
  if (::fsync(fd.get()) != 0) return Status::FromErrno(errno, "cannot fsync").with_file(parts);
  fd.reset();
  WL_RETURN_IF_ERROR(finish_blob(parts, blob));
  ::unlink(journal.c_str());
  return Status::Ok();
}

// Brings blobs/{etag} into the cache under its lock (shared with huggingface_hub).
Status fetch_blob(Ctx& c, const std::string& repo_id, const FileMeta& m) {
  const std::string storage = storage_of(c, repo_id);
  const std::string blob = storage + "/blobs/" + m.etag;
  if (path_exists(blob)) return Status::Ok();
  WL_RETURN_IF_ERROR(make_dirs(storage + "/blobs"));
  // Per-blob lock in .locks/, as huggingface_hub takes it (flock), so the two tools exclude each other.
  CrossProcessLock lock(c.cache + "/.locks/" + repo_folder_name(repo_id, c.o.repo_type) + "/" + m.etag + ".lock");
  WL_RETURN_IF_ERROR(lock.acquire());
  if (path_exists(blob)) {  // another process (ours or huggingface_hub) finished it meanwhile
    ::unlink((blob + ".wlparts").c_str());
    ::unlink((blob + ".wlparts.done").c_str());
    return Status::Ok();
  }
  const bool parallel = m.size >= c.o.parallel_min_bytes && c.o.connections_per_file > 1 &&
                        !path_exists(blob + ".incomplete");  // resume a single-stream partial as such
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {  // one fresh retry after a checksum mismatch
    s = parallel ? fetch_parallel(c, m, blob) : fetch_single(c, m, blob);
    if (s.ok() || s.code() != Code::kCorruptData) break;
    ::unlink((blob + ".incomplete").c_str());
    c.log(s.to_string() + "; downloading it again");
  }
  if (s.code() == Code::kCorruptData) ::unlink((blob + ".incomplete").c_str());
  return s;
}

Status offline_error(const std::string& what) {
  return Status::NotFound(what + " is not in the local cache and offline mode is on (HF_HUB_OFFLINE or --offline)");
}

}  // namespace

// ---- public API ------------------------------------------------------------------

Result<RepoInfo> repo_info(const std::string& repo_id, const std::string& revision, const HubOptions& o) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  Ctx c(o);
  std::string url = hub_endpoint(o) + "/api/" + type_plural(o) + "/" + repo_id + "/revision/" + url_quote(revision, false);
  WL_ASSIGN_OR_RETURN(json j, get_json(c, url));
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
  Ctx c(o);
  std::string url = hub_endpoint(o) + "/api/" + type_plural(o) + "/" + repo_id + "/tree/" + url_quote(revision, false) +
                    (path_in_repo.empty() ? "" : "/" + url_quote(path_in_repo, true)) +
                    "?recursive=" + (recursive ? "True" : "False") + "&expand=False";
  std::vector<RepoEntry> out;
  for (int page = 0; page < 100000 && !url.empty(); ++page) {
    HttpResponse resp;
    WL_ASSIGN_OR_RETURN(json j, get_json(c, url, &resp));
    if (!j.is_array()) return Status::Corrupt("tree listing is not a JSON array from " + url);
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
    // Link: <url>; rel="next"
    std::string link = resp.header("link");
    std::string next;
    auto rel = link.find("rel=\"next\"");
    if (rel != std::string::npos) {
      auto lt = link.rfind('<', rel), gt = link.find('>', lt == std::string::npos ? 0 : lt);
      if (lt != std::string::npos && gt != std::string::npos && gt < rel) next = link.substr(lt + 1, gt - lt - 1);
    }
    if (!next.empty() && url_origin(next) != url_origin(url))
      return Status::Corrupt("tree pagination points to another host: " + next.substr(0, next.find('?')));
    url = next;
  }
  return out;
}

Result<std::string> hf_hub_download(const std::string& repo_id, const std::string& filename, const std::string& revision,
                                    const HubOptions& o, const std::string& subfolder) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  WL_RETURN_IF_ERROR(check_revision(revision));
  const std::string file = subfolder.empty() ? filename : subfolder + "/" + filename;
  WL_RETURN_IF_ERROR(check_repo_path(file));
  Ctx c(o);
  const std::string storage = storage_of(c, repo_id);
  auto pointer = [&](const std::string& commit) { return storage + "/snapshots/" + commit + "/" + file; };
  if (is_commit_hash(revision) && path_exists(pointer(revision))) return pointer(revision);
  auto from_cache = [&](const Status& why) -> Result<std::string> {
    auto commit = read_ref(storage, revision);
    if (commit && path_exists(pointer(*commit))) return pointer(*commit);
    if (commit && path_exists(storage + "/.no_exist/" + *commit + "/" + file))
      return Status::NotFound("entry not found: " + repo_id + "/" + file + " (cached as missing at " + *commit + ")");
    if (hub_offline(o)) return offline_error(repo_id + "/" + file + " at revision " + revision);
    return why;
  };
  if (hub_offline(o)) return from_cache(Status::Ok());
  HttpResponse err;
  auto meta = head_file(c, repo_id, revision, file, &err);
  if (!meta.ok()) {
    HubErrorKind kind = classify_hub_error(err);
    if (kind == HubErrorKind::kEntryNotFound) {
      std::string commit = err.header("x-repo-commit");
      if (is_commit_hash(commit)) {
        (void)write_small_file(storage + "/.no_exist/" + commit + "/" + file, "");
        (void)write_ref(storage, revision, commit);
      }
      return std::move(meta).status();
    }
    if (kind == HubErrorKind::kRevisionNotFound) return std::move(meta).status();
    return from_cache(meta.status());  // network down, Hub failing, gated...: the cache may serve
  }
  WL_RETURN_IF_ERROR(write_ref(storage, revision, meta->commit));
  if (path_exists(pointer(meta->commit))) return pointer(meta->commit);
  if (c.o.progress) c.bar = std::make_unique<ProgressBar>("Downloading " + file, meta->size, true, stderr, "B");
  WL_RETURN_IF_ERROR(fetch_blob(c, repo_id, *meta));
  if (c.bar) c.bar->finish();
  WL_RETURN_IF_ERROR(link_pointer(storage, meta->commit, file, meta->etag));
  return pointer(meta->commit);
}

Result<std::string> snapshot_download(const std::string& repo_id, const SnapshotOptions& s, const HubOptions& o) {
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  const std::string revision = s.revision.empty() ? "main" : s.revision;
  WL_RETURN_IF_ERROR(check_revision(revision));
  Ctx c(o);
  const std::string storage = storage_of(c, repo_id);
  auto from_cache = [&](const Status& why) -> Result<std::string> {
    auto commit = read_ref(storage, revision);
    if (commit && ::access((storage + "/snapshots/" + *commit).c_str(), F_OK) == 0) return storage + "/snapshots/" + *commit;
    if (hub_offline(o)) return offline_error("snapshot of " + repo_id + " at revision " + revision);
    return why;
  };
  if (hub_offline(o)) return from_cache(Status::Ok());
  auto info = repo_info(repo_id, revision, o);
  if (!info.ok()) {
    if (info.status().message().starts_with("revision not found")) return std::move(info).status();
    if (info.status().code() == Code::kCorruptData) return std::move(info).status();
    return from_cache(info.status());
  }
  for (const auto& f : info->files) WL_RETURN_IF_ERROR(check_repo_path(f));
  std::vector<std::string> files = filter_repo_files(info->files, s.allow_patterns, s.ignore_patterns);
  WL_RETURN_IF_ERROR(write_ref(storage, revision, info->sha));
  const std::string snapshot = storage + "/snapshots/" + info->sha;
  WL_RETURN_IF_ERROR(make_dirs(snapshot));
  // Phase 1: metadata (a HEAD per file not yet in the snapshot), in parallel.
  std::vector<std::string> missing;
  for (const auto& f : files)
    if (!path_exists(snapshot + "/" + f)) missing.push_back(f);
  std::vector<std::optional<FileMeta>> metas(missing.size());
  std::mutex mu;
  Status first_error;
  auto parallel_for = [&](size_t count, const std::function<Status(size_t)>& fn) {
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (;;) {
        size_t k = next++;
        if (k >= count) return;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error.ok()) return;
        }
        Status st = fn(k);
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = std::move(st);
        }
      }
    };
    int n = static_cast<int>(std::min<size_t>(std::max(1, o.max_workers), count));
    std::vector<std::thread> threads;
    for (int i = 1; i < n; ++i) threads.emplace_back(worker);
    if (n > 0) worker();
    for (auto& t : threads) t.join();
  };
  parallel_for(missing.size(), [&](size_t k) -> Status {
    WL_ASSIGN_OR_RETURN(FileMeta m, head_file(c, repo_id, info->sha, missing[k], nullptr));
    metas[k] = std::move(m);
    return Status::Ok();
  });
  if (!first_error.ok()) return first_error;
  // Phase 2: bytes, largest files first (they take the longest).
  std::vector<size_t> order(missing.size());
  uint64_t total = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    order[k] = k;
    if (!path_exists(storage + "/blobs/" + metas[k]->etag)) total += metas[k]->size;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return metas[a]->size > metas[b]->size; });
  if (o.progress && total > 0)
    c.bar = std::make_unique<ProgressBar>("Fetching " + std::to_string(missing.size()) + " files", total, true, stderr, "B");
  parallel_for(order.size(), [&](size_t i) -> Status {
    const FileMeta& m = *metas[order[i]];
    WL_RETURN_IF_ERROR(fetch_blob(c, repo_id, m));
    return link_pointer(storage, info->sha, missing[order[i]], m.etag);
  });
  if (c.bar) c.bar->finish();
  if (!first_error.ok()) return first_error;
  return snapshot;
}

}  // namespace wl

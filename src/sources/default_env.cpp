// Env::Default(): the composition of the sources. Local paths go to POSIX
// files (local_env(), io/), "scheme://" paths to the source registered for
// the scheme -- the library's own HTTP and object-store sources are
// registered here on first use -- and folders overlaid by a source that
// serves files while making them (the Hub's load while downloading) to that
// source. io/ knows none of them; they all plug in through Env.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "http/remote_file.h"
#include "weightlift/io.h"
#include "weightlift/s3.h"
#include "weightlift/sources.h"

namespace wl {

namespace {

// Routes "scheme://" paths to the Env registered for the scheme, overlaid
// folders to their overlay, the rest to POSIX.
class DefaultEnv final : public Env {
 public:
  Env* route(const std::string& path) {
    std::string_view scheme = url_scheme(path);
    if (scheme.empty()) {
      if (!has_overlays_.load(std::memory_order_acquire)) return local_env();
      std::lock_guard lk(mu_);
      for (auto it = overlays_.rbegin(); it != overlays_.rend(); ++it) {
        const std::string& p = it->first;
        if (path.size() >= p.size() && path.compare(0, p.size(), p) == 0 &&
            (path.size() == p.size() || path[p.size()] == '/'))
          return it->second;
      }
      return local_env();
    }
    std::lock_guard lk(mu_);
    for (auto& [name, env] : schemes_)
      if (name == scheme) return env;
    return nullptr;
  }
  void add(std::string scheme, Env* env) {
    std::lock_guard lk(mu_);
    for (auto& [name, e] : schemes_)
      if (name == scheme) {
        e = env;
        return;
      }
    schemes_.emplace_back(std::move(scheme), env);
  }
  void add_overlay(std::string prefix, Env* env) {
    std::lock_guard lk(mu_);
    overlays_.emplace_back(std::move(prefix), env);
    has_overlays_ = true;
  }
  void remove_overlay(const std::string& prefix, Env* env) {
    std::lock_guard lk(mu_);
    std::erase_if(overlays_, [&](const auto& o) { return o.first == prefix && o.second == env; });
    has_overlays_ = !overlays_.empty();
  }

  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->open(path, o);
  }
  Result<uint64_t> file_size(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->file_size(path);
  }
  bool exists(const std::string& path) override {
    Env* e = route(path);
    return e && e->exists(path);
  }
  bool is_directory(const std::string& path) override {
    Env* e = route(path);
    return e && e->is_directory(path);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->list_dir(path);
  }
  Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& o) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->new_writable(path, o);
  }
  Status create_dirs(const std::string& path, unsigned mode) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->create_dirs(path, mode);
  }
  Status rename(const std::string& from, const std::string& to) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(to));
    if (e != route(from))
      return Status::InvalidArgument(fmt::format("cannot rename {} across sources", from)).with_file(to);
    return e->rename(from, to);
  }
  Status remove(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->remove(path);
  }
  Status symlink(const std::string& target, const std::string& link) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(link));
    return e->symlink(target, link);
  }
  Status sync_dir(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->sync_dir(path);
  }
  Result<std::unique_ptr<FileLock>> open_lock(const std::string& path, unsigned mode) override {
    WL_ASSIGN_OR_RETURN(Env * e, routed(path));
    return e->open_lock(path, mode);
  }
  void confine_writes(const std::string& dir) override { local_env()->confine_writes(dir); }
  bool is_symlink(const std::string& path) override {
    Env* e = route(path);
    return e && e->is_symlink(path);
  }
  Status wait_complete(const std::string& path) override {
    Env* e = route(path);
    return e ? e->wait_complete(path) : Status();
  }
  bool arriving(const std::string& path) override {
    Env* e = route(path);
    return e && e->arriving(path);
  }

 private:
  Result<Env*> routed(const std::string& path) {
    Env* e = route(path);
    if (e == nullptr)
      return Status::Unimplemented(fmt::format("no source for '{}://' URLs in this build", url_scheme(path)))
          .with_file(path);
    return e;
  }
  std::mutex mu_;
  std::vector<std::pair<std::string, Env*>> schemes_;
  std::vector<std::pair<std::string, Env*>> overlays_;
  std::atomic<bool> has_overlays_{false};
};

DefaultEnv& default_env() {
  static DefaultEnv env;
  return env;
}

// The library's own URL sources (process-lifetime: files may outlive static
// destruction order, so they are never destroyed).
void register_builtin_url_schemes() {
  static Env* const http = remote::new_http_env().release();
  register_url_scheme("http", http);
  register_url_scheme("https", http);
  // Held here as well: a test or caller may register another source for a
  // scheme, and these must stay reachable (and alive) all the same.
  static std::vector<std::unique_ptr<Env>>* const stores = new std::vector<std::unique_ptr<Env>>();
  for (const std::string& scheme : object_storage_schemes()) {
    stores->push_back(new_s3_env(scheme));
    register_url_scheme(scheme, stores->back().get());
  }
}

}  // namespace

Env* Env::Default() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_url_schemes(); });
  return &default_env();
}

void register_url_scheme(std::string scheme, Env* env) { default_env().add(std::move(scheme), env); }
void add_path_overlay(std::string prefix, Env* env) { default_env().add_overlay(std::move(prefix), env); }
void remove_path_overlay(const std::string& prefix, Env* env) { default_env().remove_overlay(prefix, env); }

}  // namespace wl

// HubSource: a repository's weights served while they download (hub.h).
// The snapshot folder is overlaid on Env::Default(); each weight file still
// downloading opens as a HubFile reading through its BlobFetch, while
// background requests fetch every chunk in load order and a finisher thread
// verifies, renames and links each blob in turn.
#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "hub/hub_internal.h"
#include "weightlift/lock.h"
#include "weightlift/sources.h"
#include "weightlift/weight_files.h"

namespace wl {

namespace {

struct Pending {
  FileMeta meta;
  std::string path;  // snapshot path
  std::unique_ptr<CrossProcessLock> lock;
  std::unique_ptr<BlobFetch> fetch;
  bool done = false;  // verified and linked, or failed (guarded by Impl::mu)
  Status status;
};

// A weight file being downloaded, as the loader sees it.
class HubFile final : public RandomAccessFile {
 public:
  explicit HubFile(std::shared_ptr<Pending> p) : p_(std::move(p)), version_("hub:" + p_->meta.etag) {}
  const std::string& path() const override { return p_->path; }
  uint64_t size() const override { return p_->meta.size; }
  std::string version() const override { return version_; }
  bool is_remote() const override { return true; }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    Status s = p_->fetch->read(offset, dst);
    if (!s.ok() && s.file().empty()) s.with_file(p_->path);
    return s;
  }
  // Bytes of the cache's partial file once they arrived (waiting for them):
  // file views without a copy, valid while this file lives.
  Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override {
    Status s = p_->fetch->arrive(offset, n);
    if (!s.ok()) {
      if (s.file().empty()) s.with_file(p_->path);
      return s;
    }
    return p_->fetch->partial()->view(offset, n);
  }
  // Hints reach the mapping; readahead does not (unwritten stretches are holes).
  void advise(uint64_t offset, uint64_t n, Advice advice) const override {
    if (advice == Advice::kWillNeed || advice == Advice::kSequential) return;
    if (auto f = p_->fetch->partial()) f->advise(offset, n, advice);
  }

 private:
  std::shared_ptr<Pending> p_;
  std::string version_;
};

}  // namespace

struct HubSource::Impl final : public EnvWrapper {
  HubOptions o;
  HubCtx c;
  std::string repo_id, folder;
  std::vector<std::string> weights;
  std::vector<std::shared_ptr<Pending>> pending;  // load order
  std::map<std::string, std::shared_ptr<Pending>> by_path;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::thread> threads;
  bool overlaid = false;

  // The source's own reads and writes bypass its overlay (they make the files it serves).
  static HubOptions own(HubOptions o) {
    if (!o.env) o.env = local_env();
    return o;
  }
  explicit Impl(const HubOptions& opts) : EnvWrapper(local_env()), o(own(opts)), c(o) {}

  ~Impl() override {
    if (overlaid) remove_path_overlay(folder, this);
    for (auto& p : pending) p->fetch->cancel();
    for (auto& t : threads) t.join();
  }

  std::shared_ptr<Pending> find(const std::string& path) {
    auto it = by_path.find(path);
    return it == by_path.end() ? nullptr : it->second;
  }

  void run_fetcher() {
    for (auto& p : pending) {
      try {  // nothing thrown may leave a thread
        while (auto r = p->fetch->claim(/*run=*/false)) {
          Status s = p->fetch->fetch(*r);
          if (!s.ok()) {
            p->fetch->fail(std::move(s));
            break;
          }
        }
      } catch (const std::exception& e) {
        p->fetch->fail(Status::OutOfRange(std::string("out of memory: ") + e.what()));
      }
    }
  }

  void run_finisher() {
    for (auto& p : pending) {
      Status s = p->fetch->finish();
      if (s.ok()) s = link_pointer(c, c.storage(repo_id), base_name(folder), p->meta.path, p->meta.etag);
      p->lock.reset();  // the blob is final (or abandoned): others may take it
      std::lock_guard lk(mu);
      p->done = true;
      p->status = std::move(s);
      cv.notify_all();
    }
  }

  Status wait(const std::shared_ptr<Pending>& p) {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return p->done; });
    return p->status;
  }

  // ---- the overlay ----
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& opts) override {
    auto p = find(path);
    if (!p) return target()->open(path, opts);
    auto f = std::make_shared<HubFile>(p);
    if (!opts.expect_version.empty() && opts.expect_version != f->version())
      return Status::Aborted("the file changed since the load was planned").with_file(path);
    return std::shared_ptr<RandomAccessFile>(std::move(f));
  }
  Result<uint64_t> file_size(const std::string& path) override {
    if (auto p = find(path)) return p->meta.size;
    return target()->file_size(path);
  }
  bool exists(const std::string& path) override { return find(path) != nullptr || target()->exists(path); }
  bool is_directory(const std::string& path) override { return !find(path) && target()->is_directory(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(auto entries, target()->list_dir(path));
    for (const auto& p : pending) {
      if (parent_dir(p->path) != path) continue;
      const std::string name = base_name(p->path);
      if (std::none_of(entries.begin(), entries.end(), [&](const DirEntry& e) { return e.name == name; }))
        entries.push_back({.name = name, .is_dir = false, .is_symlink = true, .size = p->meta.size});
    }
    std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return entries;
  }
  Status wait_complete(const std::string& path) override {
    if (auto p = find(path)) return wait(p);
    return target()->wait_complete(path);
  }
  // A weight file pending when the source started is served as it arrives.
  bool arriving(const std::string& path) override { return find(path) != nullptr || target()->arriving(path); }
};

// Defined in hub_weights.cpp: the allow-pattern groups download_weights_from_hf tries.
Status download_weight_groups(const std::string& model, const std::vector<std::string>& allow,
                              const std::string& revision, const HubOptions& o, const std::string& subfolder,
                              std::vector<std::vector<std::string>>* groups, bool* listed);

HubSource::HubSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HubSource::~HubSource() = default;
const std::string& HubSource::folder() const { return impl_->folder; }
const std::vector<std::string>& HubSource::weight_files() const { return impl_->weights; }
Env* HubSource::env() { return impl_->pending.empty() ? hub_env(impl_->o) : impl_.get(); }

std::vector<std::string> HubSource::pending() const {
  std::vector<std::string> out;
  for (auto& p : impl_->pending) out.push_back(p->path);
  return out;
}

Status HubSource::finish() {
  Status first;
  for (auto& p : impl_->pending) {
    Status s = impl_->wait(p);
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

Result<std::unique_ptr<HubSource>> HubSource::start(const std::string& repo_id, const std::string& revision,
                                                    const HubOptions& o) {
  auto impl = std::make_unique<Impl>(o);
  impl->repo_id = repo_id;
  const std::string rev = revision.empty() ? "main" : revision;
  auto plain = [&]() -> Result<std::unique_ptr<HubSource>> {  // nothing to stream: the cache (or a plain download)
    WL_ASSIGN_OR_RETURN(impl->folder, resolve_model_path(repo_id, rev, o));
    WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(impl->folder, hub_env(o)));
    impl->weights = std::move(wf.files);
    return std::unique_ptr<HubSource>(new HubSource(std::move(impl)));
  };
  if (hub_offline(o) || use_modelscope() || hub_env(o)->exists(repo_id)) return plain();
  WL_RETURN_IF_ERROR(check_repo_id(repo_id));
  std::vector<std::vector<std::string>> groups;
  bool listed = false;
  WL_RETURN_IF_ERROR(download_weight_groups(repo_id, {"*.safetensors", "*.bin", "*.pt"}, rev, o, "", &groups, &listed));
  if (!listed || groups.size() != 1) return plain();
  // One snapshot call: the weights (left to the background requests) and, downloaded now, the
  // index and the JSON configs that ride along (as resolve_model_path fetches them).
  SnapshotOptions s;
  s.revision = rev;
  s.allow_patterns = groups.front();
  s.allow_patterns.push_back("*.json");
  const std::vector<std::string> weights_group = groups.front();
  WL_ASSIGN_OR_RETURN(SnapshotPlan plan, snapshot_download_except(repo_id, s, o, [&](const std::string& path) {
                        return !filter_repo_files({path}, weights_group, {}).empty();
                      }));
  impl->folder = plan.folder;
  std::sort(plan.deferred.begin(), plan.deferred.end(),
            [](const FileMeta& a, const FileMeta& b) { return natural_less(a.path, b.path); });
  for (auto& m : plan.deferred) {
    // Chunks small enough that every connection works on a file and the loader is fed early:
    // a quarter of a file's share per connection, at most chunk_bytes, at least 1 MiB.
    const uint64_t most = std::max<uint64_t>(o.chunk_bytes, 1 << 20);
    const uint64_t chunk =
        std::clamp<uint64_t>(m.size / (4 * std::max<uint64_t>(1, o.connections_per_file)), 1 << 20, most);
    auto p = std::make_shared<Pending>();
    p->meta = m;
    p->path = impl->folder + "/" + m.path;
    const std::string blob = impl->c.storage(repo_id) + "/blobs/" + m.etag;
    p->lock = std::make_unique<CrossProcessLock>(blob_lock_path(impl->c, repo_id, m.etag));
    WL_RETURN_IF_ERROR(p->lock->acquire());
    if (blob_present(impl->c.env, blob)) {  // finished by another process meanwhile
      WL_RETURN_IF_ERROR(link_pointer(impl->c, impl->c.storage(repo_id), plan.commit, m.path, m.etag));
      continue;
    }
    WL_RETURN_IF_ERROR(impl->c.env->create_dirs(parent_dir(p->path)));
    WL_ASSIGN_OR_RETURN(p->fetch, BlobFetch::open(impl->c, m, chunk));
    impl->by_path[p->path] = p;
    impl->pending.push_back(std::move(p));
  }
  if (!impl->pending.empty()) {
    add_path_overlay(impl->folder, impl.get());
    impl->overlaid = true;
    // As many requests as a plain snapshot download keeps open (connections per file x files at once),
    // all working through the files in load order.
    const int files = static_cast<int>(std::min<size_t>(std::max(1, o.max_workers), impl->pending.size()));
    const int n = std::max(1, o.connections_per_file) * files;
    for (int i = 0; i < n; ++i) impl->threads.emplace_back([p = impl.get()] { p->run_fetcher(); });
    impl->threads.emplace_back([p = impl.get()] { p->run_finisher(); });
  }
  WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(impl->folder, impl->pending.empty() ? hub_env(o) : impl.get()));
  impl->weights = std::move(wf.files);
  return std::unique_ptr<HubSource>(new HubSource(std::move(impl)));
}

}  // namespace wl

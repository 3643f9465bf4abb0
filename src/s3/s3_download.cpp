// download_model_files(): the weights and configs of a model in object
// storage copied into a local folder (see weightlift/s3.h).
#include <sys/statvfs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "s3/s3_names.h"
#include "util/checked.h"
#include "util/digest.h"
#include "weightlift/glob.h"
#include "weightlift/hash.h"
#include "weightlift/s3.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"

namespace wl {

namespace {

// The vouched hash of one file, computed in file order while the chunks pass
// (read in parallel, hashed as soon as every chunk before them was): a worker
// hashes its chunk when its turn comes, so hashing overlaps the reads of the
// chunks after it and never reads a byte twice. Thread-safe.
class OrderedHash {
 public:
  explicit OrderedHash(Digest d) : d_(std::move(d)) {}
  // Blocks until chunks [0, index) are hashed (or `failed` says to stop), then hashes `data`.
  bool feed(uint64_t index, std::span<const std::byte> data, const std::function<bool()>& failed) {
    std::unique_lock lk(mu_);
    while (next_ != index) {
      if (failed()) return false;
      cv_.wait_for(lk, std::chrono::milliseconds(20));
    }
    d_.update(data);
    ++next_;
    cv_.notify_all();
    return true;
  }
  std::string hex() { return d_.hex(); }

 private:
  Digest d_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0;
};

// One file, in chunks read by `threads` workers and written at their offsets;
// renamed into place only once its bytes match the hash its source vouches for.
Status copy_file(const std::string& from, const std::string& to, const ModelDownloadOptions& o,
                 std::atomic<uint64_t>& done, uint64_t total, std::mutex& progress_mu, ModelDownloadResult& r) {
  WL_ASSIGN_OR_RETURN(auto src, o.env->open(from, {.mode = FileMode::kPread}));
  const std::optional<VouchedHash> vouched = src->vouched_hash();
  std::optional<OrderedHash> hash;
  if (vouched && verify_downloads()) {
    auto d = Digest::make(vouched->algorithm);
    if (d) hash.emplace(std::move(*d));
  }
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(to, 0644, o.env));
  const uint64_t size = src->size();
  WL_RETURN_IF_ERROR(out.resize(size));
  const uint64_t chunks = (size + o.chunk_bytes - 1) / o.chunk_bytes;
  const int n = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(o.threads), std::max<uint64_t>(chunks, 1)));
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first;
  std::function<bool()> failed = [&] {
    std::lock_guard lk(mu);
    return !first.ok();
  };
  auto worker = [&] {
    auto buf = Buffer::allocate(static_cast<size_t>(std::min(o.chunk_bytes, std::max<uint64_t>(size, 1))), 4096);
    Status s = buf.status();
    while (s.ok() && !failed()) {
      uint64_t c = next.fetch_add(1);
      if (c >= chunks) break;
      uint64_t off = c * o.chunk_bytes, len = std::min(o.chunk_bytes, size - off);
      std::span<std::byte> dst = buf->span().first(static_cast<size_t>(len));
      s = src->read_at(off, dst);
      if (s.ok()) s = out.write_at(off, dst);
      if (s.ok() && hash && !hash->feed(c, dst, failed)) break;
      if (s.ok() && o.progress) {
        uint64_t d = done.fetch_add(len) + len;
        std::lock_guard lk(progress_mu);
        o.progress(d, total);
      }
    }
    if (!s.ok()) {
      std::lock_guard lk(mu);
      if (first.ok()) first = std::move(s);
    }
  };
  auto guarded = [&] {  // nothing thrown may leave a thread
    try {
      worker();
    } catch (const std::exception& e) {
      std::lock_guard lk(mu);
      if (first.ok()) first = Status::OutOfRange(fmt::format("copying {}: {}", from, e.what()));
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(guarded);
  for (auto& t : pool) t.join();
  WL_RETURN_IF_ERROR(first);
  if (!hash) {
    r.unverified.push_back(to);
  } else if (const std::string got = hash->hex(); got != vouched->hex) {
    return Status::Corrupt(fmt::format("the copied bytes do not match the {} the source vouches for ({} {}, got {}); "
                                       "nothing was written under its name",
                                       vouched->algorithm, vouched->from, vouched->hex, got))
        .with_file(from);
  }
  return out.commit();  // the destructor removes the temporary on any earlier return
}

// A name below the source: a plain relative path of safe characters.
Status check_relative_name(const std::string& rel, const std::string& source) {
  const std::string why = s3names::relative_path_problem(rel);
  if (why.empty()) return Status();
  return Status::Corrupt(fmt::format("refusing to write a file named '{}': {}", s3names::printable_name(rel), why))
      .with_file(source);
}

// Every file below `source` (source-relative names), folder by folder.
constexpr int kMaxDepth = 16;
Status walk(Env* env, const std::string& source, const std::string& rel, int depth, uint64_t max_entries,
            std::vector<std::pair<std::string, uint64_t>>& out, uint64_t& seen) {
  const std::string here = rel.empty() ? source : join_path(source, rel);
  WL_ASSIGN_OR_RETURN(auto entries, env->list_dir(here));
  for (const auto& e : entries) {
    if (++seen > max_entries)
      return Status::OutOfRange(
                 fmt::format("more than {} entries below the source (WEIGHTLIFT_LIST_MAX_ENTRIES)", max_entries))
          .with_file(source);
    const std::string r = rel.empty() ? e.name : rel + "/" + e.name;
    WL_RETURN_IF_ERROR(check_relative_name(r, source));
    if (!e.is_dir) {
      out.emplace_back(r, e.size);
    } else if (depth + 1 >= kMaxDepth) {
      return Status::OutOfRange(fmt::format("folders nested more than {} deep below the source ('{}')", kMaxDepth, r))
          .with_file(source);
    } else {
      WL_RETURN_IF_ERROR(walk(env, source, r, depth + 1, max_entries, out, seen));
    }
  }
  return Status();
}

// Free bytes for an unprivileged writer on the disk of `dir` (or of its
// nearest existing parent); nullopt when unknown.
std::optional<uint64_t> free_bytes(std::string dir) {
  for (int i = 0; i < 64 && !dir.empty(); ++i) {
    struct statvfs st {};
    if (::statvfs(dir.c_str(), &st) == 0) return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    const std::string up = parent_dir(dir);
    if (up == dir) break;
    dir = up;
  }
  return std::nullopt;
}

}  // namespace

const std::vector<std::string>& model_config_patterns() {
  static const std::vector<std::string> p = {"*.json", "*.model", "*.tiktoken", "*.txt", "*.py"};
  return p;
}

namespace {
Result<ModelDownloadResult> download_model_files_impl(const std::string& source, const std::string& dir,
                                                      const ModelDownloadOptions& o) {
  if (o.env == nullptr) return Status::InvalidArgument("ModelDownloadOptions.env is null");
  if (o.threads < 1 || o.threads > 256)
    return Status::InvalidArgument(fmt::format("download threads {} is outside [1, 256]", o.threads));
  if (o.chunk_bytes < (uint64_t{64} << 10) || o.chunk_bytes > (uint64_t{1} << 30))
    return Status::InvalidArgument(fmt::format("download chunk of {} bytes is outside [64 KiB, 1 GiB]", o.chunk_bytes));
  if (is_url(dir)) return Status::Unimplemented("the destination must be a local folder").with_file(dir);
  WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(source, o.env));
  // Source-relative names of every file to copy, weights first.
  std::vector<std::string> names;
  for (const auto& f : wf.files) names.push_back(base_name(f));
  ModelDownloadResult r;
  const bool folder = o.env->is_directory(source);
  if (folder) {
    std::vector<std::pair<std::string, uint64_t>> below;
    uint64_t seen = 0;
    WL_RETURN_IF_ERROR(walk(o.env, source, "", 0, HttpOptions().max_list_entries, below, seen));
    std::sort(below.begin(), below.end());
    for (const auto& [rel, size] : below) {
      if (std::find(names.begin(), names.end(), rel) != names.end()) continue;
      bool want = rel == kSafetensorsIndexName;
      for (const auto& p : model_config_patterns()) want = want || (o.configs && glob_match(p, base_name(rel)));
      if (want)
        names.push_back(rel);
      else
        r.left_out.push_back(rel);
    }
  }
  std::vector<std::string> from;
  for (const auto& n : names) {
    WL_RETURN_IF_ERROR(check_relative_name(n, source));
    if (!folder && n.find('/') != std::string::npos)
      return Status::Corrupt(fmt::format("refusing to write a file named '{}'", n)).with_file(source);
    from.push_back(folder ? join_path(source, n) : source);
  }
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const auto& f : from) {
    WL_ASSIGN_OR_RETURN(uint64_t n, o.env->file_size(f));
    sizes.push_back(n);
    if (!checked_add(total, n, &total))
      return Status::Corrupt("the files' sizes add up past 2^64 bytes").with_file(source);
  }
  if (auto room = free_bytes(dir); room && total > *room)
    return Status::OutOfRange(fmt::format("the copy needs {} bytes but the disk of {} has {} free; nothing was written",
                                          total, dir, *room))
        .with_file(source);
  WL_RETURN_IF_ERROR(o.env->create_dirs(dir));
  std::atomic<uint64_t> done{0};
  std::mutex progress_mu;
  for (size_t i = 0; i < from.size(); ++i) {
    const std::string to = join_path(dir, names[i]);
    if (names[i].find('/') != std::string::npos) WL_RETURN_IF_ERROR(o.env->create_dirs(parent_dir(to)));
    WL_RETURN_IF_ERROR(copy_file(from[i], to, o, done, total, progress_mu, r));
    r.files.push_back(to);
    r.bytes += sizes[i];
  }
  return r;
}

}  // namespace

Result<ModelDownloadResult> download_model_files(const std::string& source, const std::string& dir,
                                                 const ModelDownloadOptions& o) {
  try {  // the API boundary: an allocation that fails is an error
    return download_model_files_impl(source, dir, o);
  } catch (const std::bad_alloc&) {
    return Status::OutOfRange("out of memory copying " + source);
  }
}

}  // namespace wl

// download_model_files(): the weights and configs of a model in object
// storage copied into a local folder (see weightlift/s3.h).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "weightlift/hub.h"  // fnmatch
#include "weightlift/s3.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"

namespace wl {

namespace {

// One file, in chunks read by `threads` workers and written at their offsets.
Status copy_file(const std::string& from, const std::string& to, const ModelDownloadOptions& o,
                 std::atomic<uint64_t>& done, uint64_t total, std::mutex& progress_mu) {
  WL_ASSIGN_OR_RETURN(auto src, o.env->open(from, {.mode = FileMode::kPread}));
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(to, 0644, o.env));
  const uint64_t size = src->size();
  WL_RETURN_IF_ERROR(out.resize(size));
  const uint64_t chunks = (size + o.chunk_bytes - 1) / o.chunk_bytes;
  const int n = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(o.threads), std::max<uint64_t>(chunks, 1)));
  std::atomic<uint64_t> next{0};
  std::mutex mu;
  Status first;
  auto failed = [&] {
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
  std::vector<std::thread> pool;
  for (int i = 0; i < n; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  WL_RETURN_IF_ERROR(first);
  return out.commit();  // the destructor removes the temporary on any earlier return
}

}  // namespace

const std::vector<std::string>& model_config_patterns() {
  static const std::vector<std::string> p = {"*.json", "*.model", "*.tiktoken", "*.txt", "*.py"};
  return p;
}

Result<ModelDownloadResult> download_model_files(const std::string& source, const std::string& dir,
                                                 const ModelDownloadOptions& o) {
  if (o.env == nullptr) return Status::InvalidArgument("ModelDownloadOptions.env is null");
  if (o.threads < 1 || o.threads > 256)
    return Status::InvalidArgument(fmt::format("download threads {} is outside [1, 256]", o.threads));
  if (o.chunk_bytes < (uint64_t{64} << 10) || o.chunk_bytes > (uint64_t{1} << 30))
    return Status::InvalidArgument(fmt::format("download chunk of {} bytes is outside [64 KiB, 1 GiB]", o.chunk_bytes));
  if (is_url(dir)) return Status::Unimplemented("the destination must be a local folder").with_file(dir);
  WL_ASSIGN_OR_RETURN(WeightFiles wf, find_weight_files(source, o.env));
  // (source-relative name, size) of every file to copy, weights first.
  std::vector<std::string> names;
  for (const auto& f : wf.files) names.push_back(base_name(f));
  const bool folder = o.env->is_directory(source);
  if (folder) {
    WL_ASSIGN_OR_RETURN(auto entries, o.env->list_dir(source));
    for (const auto& e : entries) {
      if (e.is_dir || std::find(names.begin(), names.end(), e.name) != names.end()) continue;
      bool want = e.name == kSafetensorsIndexName;
      for (const auto& p : model_config_patterns()) want = want || (o.configs && fnmatch(e.name, p));
      if (want) names.push_back(e.name);
    }
  }
  std::vector<std::string> from;
  for (const auto& n : names) {
    if (n.empty() || n == "." || n == ".." || n.find('/') != std::string::npos)
      return Status::Corrupt(fmt::format("refusing to write a file named '{}'", n)).with_file(source);
    from.push_back(folder ? join_path(source, n) : source);
  }
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const auto& f : from) {
    WL_ASSIGN_OR_RETURN(uint64_t n, o.env->file_size(f));
    sizes.push_back(n);
    total += n;
  }
  WL_RETURN_IF_ERROR(o.env->create_dirs(dir));
  ModelDownloadResult r;
  std::atomic<uint64_t> done{0};
  std::mutex progress_mu;
  for (size_t i = 0; i < from.size(); ++i) {
    const std::string to = join_path(dir, names[i]);
    WL_RETURN_IF_ERROR(copy_file(from[i], to, o, done, total, progress_mu));
    r.files.push_back(to);
    r.bytes += sizes[i];
  }
  return r;
}

}  // namespace wl

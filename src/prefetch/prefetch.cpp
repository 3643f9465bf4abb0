#include "weightlift/prefetch.h"

#include <mutex>

#include <fmt/format.h>

#include "core/runs.h"
#include "weightlift/tensor.h"

namespace wl {

namespace {

// One file brought into the page cache. A mapped file is brought in block
// by block by mapping the block's pages (read faults: no copy, no buffer)
// and dropping them from this process again; other sources are read into
// `buf` (allocated on first use, reused).
Status prefetch_file(const std::string& path, const PrefetchOptions& o, const std::atomic<bool>* stop, Buffer& buf) {
  WL_ASSIGN_OR_RETURN(auto f, o.env->open(path, {.mode = FileMode::kMmap}));
  // Remote: nothing to warm (no page cache). Mostly cached: mapping it in
  // again would only take the consumer's CPU.
  if (f->is_remote() || f->mostly_cached()) return Status();
  const bool mapped = f->size() == 0 || f->view(0, 1).ok();
  if (!mapped && buf.size() == 0) {
    WL_ASSIGN_OR_RETURN(buf, Buffer::allocate(static_cast<size_t>(o.block_size), 4096));
  }
  f->advise(0, f->size(), Advice::kSequential);
  for (uint64_t off = 0; off < f->size() && !(stop && stop->load()); off += o.block_size) {
    uint64_t n = std::min<uint64_t>(o.block_size, f->size() - off);
    if (mapped) {
      f->advise(off, n, Advice::kPopulate);
      f->advise(off, n, Advice::kRelease);
    } else {
      WL_RETURN_IF_ERROR(f->read_at(off, buf.span().first(static_cast<size_t>(n))));
    }
  }
  return Status();
}

Status prefetch_impl(const std::vector<std::string>& files, const PrefetchOptions& o, const std::atomic<bool>* stop) {
  std::vector<std::string> mine;
  for (size_t i = static_cast<size_t>(o.rank); i < files.size(); i += static_cast<size_t>(o.world_size))
    mine.push_back(files[i]);
  const size_t total = mine.size();
  std::mutex mu;
  size_t completed = 0;
  int next_pct = 10;
  const int threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(o.threads), std::max<size_t>(total, 1)));
  std::vector<Buffer> bufs(static_cast<size_t>(threads));  // per worker, only for files that cannot be mapped
  run_each(total, threads, [&](size_t w, size_t i) {
    if (stop && stop->load()) return false;
    Status st = prefetch_file(mine[i], o, stop, bufs[w]);
    std::lock_guard lk(mu);
    if (!st.ok()) {
      if (o.log) o.log(fmt::format("warning: failed to prefetch {}: {}", mine[i], st.to_string()));
      return true;
    }
    ++completed;
    while (o.log && next_pct <= 100 && completed * 100 >= static_cast<size_t>(next_pct) * total) {
      o.log(fmt::format("Prefetching checkpoint files: {}% ({}/{})", next_pct, completed, total));
      next_pct += 10;
    }
    return true;
  });
  return Status();
}

Status check_options(const PrefetchOptions& o) {
  if (o.threads < 1)
    return Status::InvalidArgument(fmt::format("prefetch num threads must be >= 1 (got {})", o.threads));
  if (o.block_size < 1) return Status::InvalidArgument("prefetch block size must be >= 1 byte");
  if (o.block_size > (uint64_t{1} << 30)) return Status::InvalidArgument("prefetch block size is above 1 GiB");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return Status::InvalidArgument(fmt::format("prefetch rank {} is outside [0, {})", o.rank, o.world_size));
  if (o.env == nullptr) return Status::InvalidArgument("prefetch needs an Env");
  return Status();
}

}  // namespace

Result<uint64_t> checkpoint_size_bytes(const std::vector<std::string>& files, Env* env) {
  uint64_t total = 0;
  for (auto& f : files) {
    WL_ASSIGN_OR_RETURN(uint64_t n, env->file_size(f));
    total += n;
  }
  return total;
}

AutoDecision decide_prefetch(std::string fstype, uint64_t checkpoint_bytes, uint64_t available_bytes, bool requested) {
  AutoDecision d;
  d.fstype = std::move(fstype);
  d.checkpoint_bytes = checkpoint_bytes;
  d.available_bytes = available_bytes;
  const bool net = is_network_filesystem(d.fstype);
  const bool fits = static_cast<double>(d.checkpoint_bytes) <= 0.9 * static_cast<double>(d.available_bytes);
  std::string fs = d.fstype.empty() ? "unknown" : d.fstype;
  double gib = 1024.0 * 1024 * 1024;
  std::string facts = fmt::format("filesystem {}, checkpoint {:.2f} GiB, available RAM {:.2f} GiB", fs,
                                  d.checkpoint_bytes / gib, d.available_bytes / gib);
  if (requested) {
    d.prefetch = true;
    d.warn = !fits;
    d.reason = fits ? fmt::format("prefetch ({})", facts)
                    : fmt::format(
                          "prefetch requested although the checkpoint exceeds 90% of available RAM ({}): "
                          "this may run out of memory",
                          facts);
    return d;
  }
  d.prefetch = net && fits;
  d.warn = net && !fits;
  if (d.prefetch)
    d.reason = fmt::format("auto: prefetch ({}: network filesystem and it fits in 90% of RAM)", facts);
  else if (net)
    d.reason = fmt::format("auto: lazy ({}: network filesystem but the checkpoint exceeds 90% of RAM)", facts);
  else
    d.reason = fmt::format("auto: lazy ({}: not a network filesystem; request prefetch explicitly to force it)", facts);
  return d;
}

Status prefetch_files(const std::vector<std::string>& files, const PrefetchOptions& options) {
  WL_RETURN_IF_ERROR(check_options(options));
  return prefetch_impl(files, options, nullptr);
}

Result<std::unique_ptr<Prefetcher>> Prefetcher::start(std::vector<std::string> files, PrefetchOptions options) {
  WL_RETURN_IF_ERROR(check_options(options));
  std::unique_ptr<Prefetcher> p(new Prefetcher());
  p->stop_ = std::make_shared<std::atomic<bool>>(false);
  p->thread_ = std::thread([files = std::move(files), options = std::move(options), stop = p->stop_] {
    (void)prefetch_impl(files, options, stop.get());
  });
  return p;
}

void Prefetcher::wait() {
  if (thread_.joinable()) thread_.join();
}

Prefetcher::~Prefetcher() {
  if (stop_) stop_->store(true);
  wait();
}

}  // namespace wl

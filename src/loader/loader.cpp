#include "weightlift/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "engine/plan.h"
#include "weightlift/checkpoint.h"
#include "weightlift/expert_filter.h"
#include "weightlift/prefetch.h"
#include "weightlift/weight_files.h"

namespace wl {

std::optional<Strategy> strategy_from_name(std::string_view name) {
  if (name == "lazy") return Strategy::kLazy;
  if (name == "eager") return Strategy::kEager;
  if (name == "prefetch") return Strategy::kPrefetch;
  if (name == "auto") return Strategy::kAuto;
  if (name == "threads") return Strategy::kThreads;
  if (name == "stream") return Strategy::kStream;
  return std::nullopt;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kLazy: return "lazy";
    case Strategy::kEager: return "eager";
    case Strategy::kPrefetch: return "prefetch";
    case Strategy::kAuto: return "auto";
    case Strategy::kThreads: return "threads";
    case Strategy::kStream: return "stream";
  }
  return "?";
}

namespace engine {

Result<Plan> make_plan(const std::vector<std::string>& files, const LoadOptions& o) {
  Plan plan;
  uint64_t next_ordinal = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    PlanFile pf;
    pf.path = files[fi];
    WL_ASSIGN_OR_RETURN(pf.reader, open_checkpoint(files[fi], o.env));
    const auto& ts = pf.reader->tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      const CheckpointTensor& ct = ts[i];
      if (should_skip_weight(ct.name, o.local_experts)) {
        plan.skipped++;
        continue;
      }
      PlannedTensor t;
      t.file = fi;
      t.index = i;
      t.name = ct.name;
      t.dtype = ct.dtype;
      t.full_shape = ct.shape;
      t.shape = ct.shape;
      t.nbytes = ct.nbytes;
      t.full_nbytes = ct.nbytes;
      t.file_offset = ct.file_offset;
      if (o.tp_size > 1 || !o.shard_rules.empty()) {
        if (const ShardRule* r = find_shard_rule(o.shard_rules, ct.name)) {
          auto l = shard_layout(ct.dtype, ct.shape, r->dim, o.tp_rank, o.tp_size);
          if (!l.ok()) return Status(l.status()).with_tensor(ct.name).with_file(files[fi]);
          t.shape = l->shape;
          t.nbytes = l->nbytes;
          t.shard = *l;
        }
      }
      plan.bytes_total += t.nbytes;
      pf.tensors.push_back(plan.tensors.size());
      plan.tensors.push_back(std::move(t));
    }
    std::stable_sort(pf.tensors.begin(), pf.tensors.end(), [&](size_t a, size_t b) {
      return plan.tensors[a].file_offset.value_or(0) < plan.tensors[b].file_offset.value_or(0);
    });
    for (size_t k : pf.tensors) plan.tensors[k].ordinal = next_ordinal++;
    if (fi >= kKeepOpen) pf.reader.reset();
    plan.files.push_back(std::move(pf));
  }
  return plan;
}

Result<CheckpointReader*> reader_of(PlanFile& pf, Env* env) {
  if (!pf.reader) {
    WL_ASSIGN_OR_RETURN(pf.reader, open_checkpoint(pf.path, env));
  }
  return pf.reader.get();
}

Status Delivery::deliver(const PlannedTensor& t, const std::string& file, TensorView view) {
  std::lock_guard lk(mu_);
  if (!status_.ok()) return status_;
  LoadedTensor lt;
  lt.name = t.name;
  lt.file = file;
  lt.view = std::move(view);
  lt.full_shape = t.full_shape;
  lt.ordinal = t.ordinal;
  Status s = sink_(std::move(lt));
  if (!s.ok()) {
    status_ = s;
    stop_.store(true);
    return s;
  }
  p_.bytes_done += t.nbytes;
  p_.tensors_done++;
  if (o_.progress && !o_.progress(p_)) {
    status_ = Status::Cancelled("load cancelled by the progress callback").with_file(file);
    stop_.store(true);
    return status_;
  }
  return Status();
}

Result<TensorView> materialize(const PlannedTensor& t, const LoadOptions& o,
                               const std::function<Status(std::span<std::byte>)>& fill) {
  if (o.destination) {
    TensorRequest req{t.name, t.dtype, t.shape, t.nbytes};
    auto dst = o.destination(req);
    if (!dst.ok()) return Status(dst.status()).with_tensor(t.name);
    if (dst->size() != t.nbytes)
      return Status::InvalidArgument(fmt::format("destination holds {} bytes, the tensor needs {}", dst->size(), t.nbytes))
          .with_tensor(t.name);
    WL_RETURN_IF_ERROR(fill(*dst));
    return TensorView(t.dtype, t.shape, *dst, nullptr);
  }
  auto out = Tensor::empty(t.dtype, t.shape);
  if (!out.ok()) return Status(out.status()).with_tensor(t.name);
  WL_RETURN_IF_ERROR(fill(out->mutable_bytes()));
  return out->view();
}

namespace {

// This rank's bytes of `full` (the whole tensor): shared as is when allowed,
// else copied (narrowed when sharded).
Result<TensorView> extract(const PlannedTensor& t, const TensorView& full, const LoadOptions& o, bool share) {
  if (!t.shard && share && !o.destination) return TensorView(t.dtype, t.shape, full.bytes(), full.owner());
  return materialize(t, o, [&](std::span<std::byte> dst) -> Status {
    if (!t.shard) {
      if (full.nbytes() != dst.size())
        return Status::Internal(fmt::format("tensor holds {} bytes, expected {}", full.nbytes(), dst.size()));
      if (!dst.empty()) std::memcpy(dst.data(), full.data(), dst.size());
      return Status();
    }
    const ShardLayout& l = *t.shard;
    if (l.outer && l.first + (l.outer - 1) * l.stride + l.run > full.nbytes())
      return Status::Internal("shard layout exceeds the tensor");
    for (uint64_t i = 0; i < l.outer; ++i) std::memcpy(dst.data() + i * l.run, full.data() + l.first + i * l.stride, l.run);
    return Status();
  });
}

Status load_file_lazy(Plan& plan, size_t fi, const LoadOptions& o, Delivery& d) {
  PlanFile& pf = plan.files[fi];
  // A file whose reader was closed after planning is mapped again without
  // reparsing its header: the plan already knows where each tensor lies.
  std::shared_ptr<RandomAccessFile> mapped;
  if (!pf.reader) {
    WL_ASSIGN_OR_RETURN(mapped, o.env->open(pf.path, {.mode = FileMode::kMmap}));
    mapped->advise(0, mapped->size(), Advice::kSequential);
  }
  for (size_t ti : pf.tensors) {
    if (d.stopped()) return d.status();
    const PlannedTensor& t = plan.tensors[ti];
    if (!t.shard && t.file_offset) {
      // Whole tensors are read with pread (a file truncated under us is an
      // error, not SIGBUS from a mapping).
      if (!mapped && !o.destination) {  // the reader's own pread copy is the result
        WL_ASSIGN_OR_RETURN(CheckpointReader * r, reader_of(pf, o.env));
        auto owned = r->read(t.index);
        if (!owned.ok()) return Status(owned.status()).with_tensor(t.name).with_file(pf.path);
        WL_RETURN_IF_ERROR(d.deliver(t, pf.path, owned->view()));
        continue;
      }
      auto v = materialize(t, o, [&](std::span<std::byte> dst) -> Status {
        if (mapped) return mapped->read_at(*t.file_offset, dst);
        WL_ASSIGN_OR_RETURN(CheckpointReader * r, reader_of(pf, o.env));
        WL_ASSIGN_OR_RETURN(Tensor owned, r->read(t.index));
        if (owned.nbytes() != dst.size()) return Status::Internal("tensor size changed");
        if (!dst.empty()) std::memcpy(dst.data(), owned.bytes().data(), dst.size());
        return Status();
      });
      if (!v.ok()) return Status(v.status()).with_tensor(t.name).with_file(pf.path);
      WL_RETURN_IF_ERROR(d.deliver(t, pf.path, std::move(*v)));
      continue;
    }
    TensorView full;
    if (mapped && t.file_offset) {
      auto bytes = mapped->view(*t.file_offset, t.full_nbytes);
      if (!bytes.ok()) return Status(bytes.status()).with_tensor(t.name);
      full = TensorView(t.dtype, t.full_shape, *bytes, mapped);
    } else {
      WL_ASSIGN_OR_RETURN(CheckpointReader * r, reader_of(pf, o.env));
      auto v = r->view(t.index);
      if (!v.ok()) return Status(v.status()).with_tensor(t.name).with_file(pf.path);
      full = *v;
    }
    WL_ASSIGN_OR_RETURN(TensorView v, extract(t, full, o, /*share=*/false));
    WL_RETURN_IF_ERROR(d.deliver(t, pf.path, std::move(v)));
  }
  pf.reader.reset();  // unmap
  d.file_done();
  return Status();
}

// Reads the whole file with one read; tensors stored contiguously view that
// buffer, the others come from the reader.
Status load_file_eager(Plan& plan, size_t fi, const LoadOptions& o, Delivery& d, uint64_t* bytes_read) {
  PlanFile& pf = plan.files[fi];
  WL_ASSIGN_OR_RETURN(auto f, o.env->open(pf.path, {.mode = FileMode::kPread}));
  auto buf = Buffer::allocate(static_cast<size_t>(f->size()), 4096);
  if (!buf.ok()) return Status(buf.status()).with_file(pf.path);
  auto owner = std::make_shared<Buffer>(std::move(*buf));
  WL_RETURN_IF_ERROR(f->read_at(0, owner->span()));
  *bytes_read += f->size();
  for (size_t ti : pf.tensors) {
    if (d.stopped()) return d.status();
    const PlannedTensor& t = plan.tensors[ti];
    TensorView full;
    const uint64_t full_bytes = t.full_nbytes;
    if (t.file_offset && *t.file_offset <= owner->size() && full_bytes <= owner->size() - *t.file_offset) {
      full = TensorView(t.dtype, t.full_shape, owner->span().subspan(*t.file_offset, full_bytes), owner);
    } else {
      WL_ASSIGN_OR_RETURN(CheckpointReader * r, reader_of(pf, o.env));
      auto v = r->view(t.index);
      if (!v.ok()) return Status(v.status()).with_tensor(t.name).with_file(pf.path);
      full = *v;
    }
    WL_ASSIGN_OR_RETURN(TensorView v, extract(t, full, o, /*share=*/true));
    WL_RETURN_IF_ERROR(d.deliver(t, pf.path, std::move(v)));
  }
  pf.reader.reset();
  d.file_done();
  return Status();
}

int default_threads(const LoadOptions& o) { return o.threads > 0 ? o.threads : 8; }

Status run_threads(Plan& plan, const LoadOptions& o, Delivery& d, uint64_t* bytes_read) {
  const int n = std::min<int>(default_threads(o), static_cast<int>(std::max<size_t>(plan.files.size(), 1)));
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> read_total{0};
  auto worker = [&] {
    while (!d.stopped()) {
      size_t fi = next.fetch_add(1);
      if (fi >= plan.files.size()) return;
      uint64_t r = 0;
      Status s = load_file_eager(plan, fi, o, d, &r);
      read_total += r;
      if (!s.ok()) {
        d.fail(s);
        return;
      }
    }
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) ts.emplace_back(worker);
  for (auto& t : ts) t.join();
  *bytes_read = read_total.load();
  return d.status();
}

}  // namespace
}  // namespace engine

Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& options,
                             const std::function<Status(LoadedTensor&&)>& sink) {
  using namespace engine;
  auto t0 = std::chrono::steady_clock::now();
  const LoadOptions& o = options;
  if (o.env == nullptr) return Status::InvalidArgument("LoadOptions.env is null");
  if (o.threads < 0) return Status::InvalidArgument(fmt::format("thread count {} is negative", o.threads));
  if (o.threads > 1024) return Status::InvalidArgument(fmt::format("thread count {} is above 1024", o.threads));
  if (o.block_size > (uint64_t{1} << 30)) return Status::InvalidArgument("block size is above 1 GiB");
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is outside [0, {})", o.tp_rank, o.tp_size));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return Status::InvalidArgument(fmt::format("rank {} is outside [0, {})", o.rank, o.world_size));

  LoadStats stats;
  Strategy s = o.strategy;
  if (s == Strategy::kAuto) {
    auto dec = decide_auto(files, o.env, o.mounts_path, o.meminfo_path, o.meminfo_path == kProcMeminfo ? "/sys/fs/cgroup" : "");
    if (!dec.ok()) {
      if (o.log) o.log("auto: lazy (" + dec.status().to_string() + ")");
      s = Strategy::kLazy;
    } else {
      if (o.log) o.log(dec->reason);
      s = dec->prefetch ? Strategy::kPrefetch : Strategy::kLazy;
    }
  }
  stats.strategy = s;
  WL_ASSIGN_OR_RETURN(Plan plan, make_plan(files, o));
  stats.skipped_tensors = plan.skipped;
  Delivery d(o, sink, plan);
  Status st;
  switch (s) {
    case Strategy::kPrefetch: {
      PrefetchOptions po;
      po.threads = o.threads > 0 ? o.threads : kDefaultPrefetchThreads;
      po.block_size = o.block_size > 0 ? o.block_size : kDefaultPrefetchBlockSize;
      po.rank = o.rank;
      po.world_size = o.world_size;
      po.env = o.env;
      po.log = o.log;
      WL_ASSIGN_OR_RETURN(auto pre, Prefetcher::start(files, po));
      for (size_t fi = 0; fi < plan.files.size() && st.ok(); ++fi) st = load_file_lazy(plan, fi, o, d);
      pre.reset();
      for (auto& t : plan.tensors) stats.bytes_read += t.nbytes;
      break;
    }
    case Strategy::kAuto:
    case Strategy::kLazy:
      for (size_t fi = 0; fi < plan.files.size() && st.ok(); ++fi) st = load_file_lazy(plan, fi, o, d);
      for (auto& t : plan.tensors) stats.bytes_read += t.nbytes;
      break;
    case Strategy::kEager:
      for (size_t fi = 0; fi < plan.files.size() && st.ok(); ++fi) st = load_file_eager(plan, fi, o, d, &stats.bytes_read);
      break;
    case Strategy::kThreads:
      st = run_threads(plan, o, d, &stats.bytes_read);
      break;
    case Strategy::kStream:
      st = run_stream(plan, o, d, stats);
      break;
  }
  if (st.ok()) st = d.status();
  if (!st.ok()) return st;
  stats.tensors = d.tensors();
  stats.bytes = d.bytes();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

uint64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace wl

// The per-file strategies (lazy, eager, threads, prefetch) and execute():
// each reads only the plan (load_plan.h).
#include "engine/strategies.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "core/runs.h"
#include "engine/load_plan.h"
#include "weightlift/prefetch.h"

namespace wl::engine {

namespace {

// A tensor whose bytes are in `full` (host memory): shared as is when the
// engine chose the memory and allowed it, else copied into the destination.
Status deliver_from(const PlannedTensor& t, const PlanFile& pf, const TensorView& full, const LoadPlan::Body& b,
                    Destination& dest, Delivery& d, bool share) {
  if (!t.shard && share && b.destination == nullptr)
    return d.deliver(t, pf.path, TensorView(t.dtype, t.shape, full.bytes(), full.owner()));
  WL_ASSIGN_OR_RETURN(Region r, place(t, dest), .file = pf.path);
  WL_RETURN_IF_ERROR(copy_shard(dest, t, r, full.bytes()), .tensor = t.name, .file = pf.path);
  return d.deliver(t, pf.path, view_of(t, r));
}

// A tensor copied into the destination (shards, or a caller's memory) out of
// the file's mapping, or, where its bytes do not lie contiguously in the file,
// out of the reader.
Status copy_from_mapping(const PlannedTensor& t, const PlanFile& pf, const std::shared_ptr<RandomAccessFile>& file,
                         const LoadPlan::Body& b, Destination& dest, Delivery& d) {
  TensorView full;
  auto bytes = t.file_offset ? file->view(*t.file_offset, t.full_nbytes)
                             : Result<std::span<const std::byte>>(Status::Unimplemented(""));
  if (bytes.ok()) {
    full = TensorView(t.dtype, t.full_shape, *bytes, file);
  } else {
    WL_ASSIGN_OR_RETURN(CheckpointReader * reader, reader_of(pf, b.env));
    WL_ASSIGN_OR_RETURN(full, reader->view(t.index), .tensor = t.name, .file = pf.path);
  }
  return deliver_from(t, pf, full, b, dest, d, /*share=*/false);
}

// The owner of a tensor handed over as a view of a private file mapping
// (LoadOptions::file_views): keeps the mapping alive and, when the last view
// dies, drops the tensor's pages from this process.
struct MappedTensor {
  std::shared_ptr<RandomAccessFile> file;
  uint64_t offset = 0, nbytes = 0;
  MappedTensor(std::shared_ptr<RandomAccessFile> f, uint64_t off, uint64_t n)
      : file(std::move(f)), offset(off), nbytes(n) {}
  ~MappedTensor() { file->advise(offset, nbytes, Advice::kRelease); }
};

bool as_view(const PlannedTensor& t, const ReadPath& path) {
  return path.file_views && !t.shard && t.file_offset.has_value();
}

// Hands a tensor over as a view of `file` (a private mapping). With
// `populate`, its pages are then mapped in while it waits in the queue (the
// consumer never waits for that: a consumer already at it maps the pages in
// alongside), unless the consumer has already let it go.
Status deliver_view(const PlannedTensor& t, const PlanFile& pf, const std::shared_ptr<RandomAccessFile>& file,
                    Delivery& d, bool populate) {
  WL_ASSIGN_OR_RETURN(auto span, file->view(*t.file_offset, t.nbytes), .tensor = t.name, .file = pf.path);
  auto owner = std::make_shared<MappedTensor>(file, *t.file_offset, t.nbytes);
  std::weak_ptr<MappedTensor> alive = owner;
  WL_RETURN_IF_ERROR(d.deliver(t, pf.path, TensorView(t.dtype, t.shape, span, std::move(owner))));
  if (populate && t.nbytes > 0)
    if (auto keep = alive.lock()) file->advise(*t.file_offset, t.nbytes, Advice::kPopulate);
  return Status();
}

// Starts reading the planned tensors' ranges into the page cache (asynchronous
// readahead, adjacent ranges merged) so that mapping them in tensor by tensor
// waits on the disk once per range, not once per fault.
void will_need(const Plan& plan, const PlanFile& pf, const RandomAccessFile& file) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t ti : pf.tensors) {
    const PlannedTensor& t = plan.tensors[ti];
    if (t.file_offset && t.full_nbytes) ranges.emplace_back(*t.file_offset, *t.file_offset + t.full_nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  constexpr uint64_t kGap = uint64_t{1} << 20;
  for (size_t i = 0; i < ranges.size();) {
    uint64_t a = ranges[i].first, b = ranges[i].second;
    for (++i; i < ranges.size() && ranges[i].first <= b + kGap; ++i) b = std::max(b, ranges[i].second);
    file.advise(a, b - a, Advice::kWillNeed);
  }
}

Status load_file_lazy(const LoadPlan::Body& b, size_t fi, Destination& dest, Delivery& d) {
  const Plan& plan = b.plan;
  const ReadPath& path = b.path;
  const PlanFile& pf = plan.files[fi];
  // The data is read from the planned version of the file: whole tensors with
  // pread (a file truncated under us is an error, not SIGBUS), shards cut out
  // of the mapping; with file_views, whole tensors are views of a private mapping.
  const bool views = path.file_views;
  WL_ASSIGN_OR_RETURN(auto file, open_data(pf, b.env, views ? FileMode::kMmapPrivate : FileMode::kMmap));
  file->advise(0, file->size(), Advice::kSequential);
  // Readahead hints walk the whole file: only where part of it is not cached
  // (and not for views the caller reads in itself).
  if (views && path.populate_views && !file->mostly_cached()) will_need(plan, pf, *file);
  PendingCopies pending;  // device destinations: copies in flight
  Status st = [&]() -> Status {
    for (size_t ti : pf.tensors) {
      if (d.stopped()) break;
      const PlannedTensor& t = plan.tensors[ti];
      if (as_view(t, path)) {
        WL_RETURN_IF_ERROR(deliver_view(t, pf, file, d, /*populate=*/path.populate_views));
        continue;
      }
      if (!t.shard && t.file_offset) {
        WL_ASSIGN_OR_RETURN(Region r, place(t, dest), .file = pf.path);
        Status s = read_region(dest, r, 0, *file, *t.file_offset, t.nbytes, pending);
        if (s.ok() && !r.device.host_accessible()) s = pending.wait();
        WL_RETURN_IF_ERROR(s, .tensor = t.name, .file = pf.path);
        WL_RETURN_IF_ERROR(d.deliver(t, pf.path, view_of(t, r)));
        continue;
      }
      WL_RETURN_IF_ERROR(copy_from_mapping(t, pf, file, b, dest, d));
    }
    return Status();
  }();
  Status copies = pending.wait();  // never leave with copies in flight
  WL_RETURN_IF_ERROR(st);
  WL_RETURN_IF_ERROR(copies);
  pf.reader.reset();  // unmap
  d.file_done();
  return d.status();
}

// Reads the whole file with one read; tensors stored contiguously view that
// buffer, the others come from the reader.
Status load_file_eager(const LoadPlan::Body& b, size_t fi, Destination& dest, Delivery& d, uint64_t* bytes_read) {
  const Plan& plan = b.plan;
  const ReadPath& path = b.path;
  const PlanFile& pf = plan.files[fi];
  if (path.file_views) {
    // The whole file is read in before its first tensor only where it is not
    // in the page cache already (the point of eager is one sequential read);
    // a cached file's tensors are handed over as lazy hands them over.
    WL_ASSIGN_OR_RETURN(auto file, open_data(pf, b.env, FileMode::kMmapPrivate));
    const bool cached = file->mostly_cached();
    file->advise(0, file->size(), Advice::kSequential);
    if (!cached && path.populate_views) file->advise(0, file->size(), Advice::kPopulate);
    if (path.populate_views) *bytes_read += file->size();
    for (size_t ti : pf.tensors) {
      if (d.stopped()) return d.status();
      const PlannedTensor& t = plan.tensors[ti];
      if (as_view(t, path)) {
        WL_RETURN_IF_ERROR(deliver_view(t, pf, file, d, /*populate=*/cached && path.populate_views));
        continue;
      }
      WL_RETURN_IF_ERROR(copy_from_mapping(t, pf, file, b, dest, d));
    }
    pf.reader.reset();
    d.file_done();
    return Status();
  }
  WL_ASSIGN_OR_RETURN(auto f, open_data(pf, b.env, FileMode::kPread));
  auto buf = Buffer::allocate(static_cast<size_t>(f->size()), 4096);
  if (!buf.ok()) {  // name the tensor that makes the file that large, if one does
    Status s = Status(buf.status()).with_file(pf.path);
    for (size_t ti : pf.tensors)
      if (plan.tensors[ti].full_nbytes > f->size() / 2) s.with_tensor(plan.tensors[ti].name);
    return s;
  }
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
      WL_ASSIGN_OR_RETURN(CheckpointReader * r, reader_of(pf, b.env));
      WL_ASSIGN_OR_RETURN(full, r->view(t.index), .tensor = t.name, .file = pf.path);
    }
    WL_RETURN_IF_ERROR(deliver_from(t, pf, full, b, dest, d, /*share=*/true));
  }
  pf.reader.reset();
  d.file_done();
  return Status();
}

}  // namespace

Status run_lazy(const LoadPlan& plan, Delivery& d, LoadStats& stats) {
  const LoadPlan::Body& b = plan.body();
  Destination& dest = destination_of(b);
  for (size_t fi = 0; fi < b.plan.files.size(); ++fi) WL_RETURN_IF_ERROR(load_file_lazy(b, fi, dest, d));
  for (auto& t : b.plan.tensors) stats.bytes_read += t.nbytes;
  return Status();
}

Status run_eager(const LoadPlan& plan, Delivery& d, LoadStats& stats) {
  const LoadPlan::Body& b = plan.body();
  Destination& dest = destination_of(b);
  for (size_t fi = 0; fi < b.plan.files.size(); ++fi)
    WL_RETURN_IF_ERROR(load_file_eager(b, fi, dest, d, &stats.bytes_read));
  return Status();
}

Status run_threads(const LoadPlan& plan, Delivery& d, LoadStats& stats) {
  const LoadPlan::Body& b = plan.body();
  Destination& dest = destination_of(b);
  std::atomic<uint64_t> read_total{0};
  run_each(b.plan.files.size(), b.path.workers, [&](size_t, size_t fi) {
    if (d.stopped()) return false;
    uint64_t r = 0;
    // With file_views a worker maps its file tensor by tensor (as lazy), so
    // N workers hold N tensors, not N files, ahead of the consumer.
    Status s = b.path.file_views ? load_file_lazy(b, fi, dest, d) : load_file_eager(b, fi, dest, d, &r);
    read_total += r;
    if (s.ok()) return true;
    d.fail(s);
    return false;
  });
  stats.bytes_read += read_total.load();
  return d.status();
}

Status run_prefetch(const LoadPlan& plan, Delivery& d, LoadStats& stats) {
  const LoadPlan::Body& b = plan.body();
  PrefetchOptions po;
  po.threads = b.path.prefetch_threads;
  po.block_size = b.path.prefetch_block;
  po.rank = b.rank;
  po.world_size = b.world_size;
  po.env = b.env;
  po.log = b.log;
  WL_ASSIGN_OR_RETURN(auto pre, Prefetcher::start(b.files, po));
  Status st = run_lazy(plan, d, stats);
  pre.reset();
  return st;
}

}  // namespace wl::engine

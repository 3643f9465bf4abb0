// The stream strategy: every selected byte range of every file, laid end to
// end as one stream, cut into chunks that N I/O threads claim in order. A
// tensor is handed over the moment its last byte lands.
//
// Where the bytes go:
//   host destination, buffered reads   pread straight into the tensors' memory
//                                      (a remote source: one ranged GET per run
//                                      of adjacent pieces, scattered into them)
//   host destination, O_DIRECT         aligned reads into a per-thread staging
//                                      buffer, copied into the tensors (never
//                                      handed out)
//   device destination                 aligned reads into a slot of the
//                                      destination's pinned ring, then async
//                                      copies; a tensor is handed over when
//                                      its last copy has completed
//   device destination, GDS            cuFile reads straight into the
//                                      tensors' device memory (decided before
//                                      the first tensor is handed over)
//   device destination, page cache     async copies straight out of the hot
//                                      file's mapping, registered read-only
//                                      for DMA (the plan's copy source)
//
// Everything that decides how it reads (threads, read size, memory window,
// O_DIRECT, GDS, the copy source) is the plan's (choose(), read_path.h's
// StreamSetup); the steps of run_stream(), one member function of Stream each:
//   lay_out                  the tensors' byte ranges end to end
//   begin                    the destination learns whether GDS serves the load
//   map_segments             copies out of the page cache: the bytes each segment gives
//   hand_over_empty_tensors  zero-byte tensors (and every buffer up front when uncapped)
//   read_in_parallel         workers claim chunks, read each run of adjacent
//                            pieces, and hand tensors over as they complete
//   read_strided_tensors     tensors without contiguous storage, through their reader
//   finish                   the files done, the statistics
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/strategies.h"
#include "weightlift/system.h"

namespace wl::engine {

namespace {

constexpr uint64_t kAlign = 4096;

struct Extent {
  uint64_t pos;  // stream position
  uint64_t file_off;
  uint64_t len;
  uint64_t dst_off;  // inside the tensor's bytes
  uint32_t file;
  uint32_t tensor;  // index into Plan::tensors
};

struct TensorState {
  std::atomic<uint64_t> remaining{0};
  std::once_flag once;
  Status alloc_status;
  Region region;
  uint64_t first_pos = 0, end_pos = 0;
};

// The part of one extent that falls in a claimed chunk.
struct Piece {
  uint32_t file, tensor;
  uint64_t file_off, len, dst_off;
};

// Copies to a device straight out of a hot file's page cache: the file is
// mapped read-only and registered for DMA in segments of kSegment bytes,
// each by the first reader that needs it, and unregistered (its pages
// dropped from this process) once every byte the load takes from it was
// copied; no reader copies bytes into a ring slot first.
constexpr uint64_t kSegment = uint64_t{16} << 20;

struct MappedFile {
  std::shared_ptr<RandomAccessFile> map;  // FileMode::kMmap: view() spans stay valid while it lives
  const std::byte* base = nullptr;
  uint64_t size = 0;
  HostRegistration* up = nullptr;
  std::mutex mu;
  std::vector<uint8_t> seg;                 // per segment: 0 not yet, 1 registered, 2 refused, 3 done
  std::vector<std::atomic<uint64_t>> left;  // per segment: bytes still to copy out of it
  ~MappedFile() {
    for (size_t k = 0; k < seg.size(); ++k)
      if (seg[k] == 1) up->unregister_host(base + k * kSegment);
  }
  // Segment k registered (once); the uploader's refusal otherwise.
  Status ensure(size_t k) {
    std::lock_guard lk(mu);
    if (seg[k] == 1) return Status();
    if (seg[k] != 0) return Status::Unimplemented("the segment cannot be registered");
    Status s = up->register_host(base + k * kSegment, std::min(kSegment, size - k * kSegment));
    seg[k] = s.ok() ? 1 : 2;
    return s;
  }
  // n bytes of segment k were copied: the last ones unregister it.
  void copied(size_t k, uint64_t n) {
    if (left[k].fetch_sub(n) != n) return;
    std::lock_guard lk(mu);
    if (seg[k] != 1) return;
    seg[k] = 3;
    up->unregister_host(base + k * kSegment);
    map->advise(k * kSegment, std::min(kSegment, size - k * kSegment), Advice::kRelease);
  }
};

class Stream {
 public:
  Stream(const LoadPlan::Body& b, Destination& dest, Delivery& d)
      : plan_(b.plan), path_(b.path), setup_(b.path.stream), env_(b.env), system_(b.system), log_(b.log), dest_(dest),
        d_(d), up_(dest.uploader()), device_(!dest.device().host_accessible()), direct_(setup_.direct),
        gds_(device_ && setup_.gds), remote_(!plan_.files.empty() && is_url(plan_.files[0].path)),
        threads_(setup_.threads), chunk_(setup_.read_size), window_(setup_.window), ts_(plan_.tensors.size()),
        files_(plan_.files.size()), file_pending_(plan_.files.size(), 0), delivered_(plan_.tensors.size(), 0) {}

  Status check_destination() const;
  void lay_out();
  void begin();
  void map_segments();
  Status hand_over_empty_tensors();
  Status read_in_parallel();
  Status read_strided_tensors();
  void finish(LoadStats& stats);

 private:
  // Files open on first use (the planned version, else kAborted) and close
  // once their last tensor is handed over, so thousands of shards never hold
  // thousands of descriptors.
  Result<std::shared_ptr<RandomAccessFile>> file_of(size_t fi);
  void tensor_done(size_t ti);
  Status ensure_alloc(size_t ti);
  Status hand_over(size_t ti);
  void landed(size_t ti, uint64_t len);

  void worker();
  bool claim(uint64_t* a, uint64_t* b);
  void pieces_of(uint64_t a, uint64_t b, std::vector<Piece>& pieces) const;
  Status read_run(std::span<const Piece> run, Buffer& staging);
  Status read_direct(const RandomAccessFile& f, std::span<const Piece> run);
  Status read_staged(const RandomAccessFile& f, std::span<const Piece> run, std::span<std::byte> buf,
                     std::optional<StagingSlot> slot);
  Status read_scatter(const RandomAccessFile& f, std::span<const Piece> run);
  std::shared_ptr<MappedFile> mapped_of(size_t fi);
  bool read_mapped(std::span<const Piece> run, Status* out);
  Status named(Status s, std::span<const Piece> run) const;

  const Plan& plan_;
  const ReadPath& path_;
  const StreamSetup& setup_;
  Env* const env_;
  SystemInfo* const system_;
  const std::function<void(const std::string&)>& log_;
  Destination& dest_;
  Delivery& d_;
  Uploader* const up_;
  const bool device_, direct_, gds_, remote_;
  const int threads_;
  const uint64_t chunk_;
  const uint64_t window_;  // memory of allocated, undelivered tensors; 0: unlimited

  // The layout.
  std::vector<Extent> ext_;
  std::vector<size_t> late_;   // tensors without contiguous storage: read through the reader
  std::vector<size_t> order_;  // tensors in stream order
  std::vector<TensorState> ts_;
  uint64_t total_ = 0;

  std::mutex files_mu_;
  std::vector<std::shared_ptr<RandomAccessFile>> files_;
  std::vector<size_t> file_pending_;

  // Device copies out of the registered page cache (see MappedFile).
  HostRegistration* host_ = nullptr;
  bool mapped_ = false;
  std::atomic<bool> mapped_ok_{false};                     // false once a registration was refused
  std::vector<std::vector<uint64_t>> segment_bytes_;       // bytes the load copies out of each segment of each file
  std::vector<std::shared_ptr<MappedFile>> mapped_files_;  // under files_mu_

  // Watermark: stream position of the earliest tensor not yet handed over.
  std::mutex wm_mu_;
  std::condition_variable wm_cv_;
  std::vector<char> delivered_;
  size_t wm_ptr_ = 0;
  uint64_t next_chunk_ = 0;
  std::atomic<uint64_t> bytes_read_{0};
};

// The plan was made for this destination (choose() checked its uploader);
// a stream never runs on without one.
Status Stream::check_destination() const {
  if (device_ && up_ == nullptr)
    return Status::InvalidArgument(fmt::format("a {} destination needs an uploader", dest_.device().to_string()));
  if (chunk_ == 0 || threads_ < 1) return Status::Internal("the plan gives the stream no threads or reads");
  return Status();
}

void Stream::lay_out() {
  uint64_t pos = 0;
  for (size_t fi = 0; fi < plan_.files.size(); ++fi) {
    for (size_t ti : plan_.files[fi].tensors) {
      const PlannedTensor& t = plan_.tensors[ti];
      if (!t.file_offset) {
        late_.push_back(ti);
        continue;
      }
      ts_[ti].first_pos = pos;
      if (t.nbytes == 0) {
        order_.push_back(ti);
        ts_[ti].end_pos = pos;
        continue;
      }
      auto add = [&](uint64_t off, uint64_t len, uint64_t dst_off) {
        ext_.push_back({pos, off, len, dst_off, static_cast<uint32_t>(fi), static_cast<uint32_t>(ti)});
        pos += len;
      };
      if (!t.shard) {
        add(*t.file_offset, t.nbytes, 0);
      } else {
        const ShardLayout& l = *t.shard;
        for (uint64_t i = 0; i < l.outer; ++i) add(*t.file_offset + l.first + i * l.stride, l.run, i * l.run);
      }
      ts_[ti].remaining.store(t.nbytes);
      ts_[ti].end_pos = pos;
      order_.push_back(ti);
    }
  }
  total_ = pos;
  for (size_t ti : order_) file_pending_[plan_.tensors[ti].file]++;
}

// The destination learns how this load reads: GPUDirect Storage decided
// once, before any tensor is handed over (the zero-byte ones included), from
// the first file (choose()); false stages every read through the ring. A
// stopped load (an error, a cancel) wakes readers waiting for a slot.
void Stream::begin() {
  if (device_ && !plan_.files.empty())
    if (DirectReads* direct = up_->direct_reads()) direct->chosen(gds_, path_.gds_off);
  if (up_) d_.on_stop([up = up_] { up->cancel(); });
}

// Device copies straight out of the page cache (see MappedFile) where the
// plan says so: the bytes the load takes from each 16 MiB segment of each file.
void Stream::map_segments() {
  host_ = device_ && !gds_ && !direct_ && !remote_ ? up_->host_registration() : nullptr;
  mapped_ = host_ != nullptr && setup_.copy_source == CopySource::kMapped;
  mapped_ok_ = mapped_;
  if (!mapped_) return;
  segment_bytes_.resize(plan_.files.size());
  mapped_files_.resize(plan_.files.size());
  for (const Extent& x : ext_)
    for (uint64_t off = x.file_off, rest = x.len; rest > 0;) {
      const size_t k = static_cast<size_t>(off / kSegment);
      const uint64_t n = std::min(rest, (k + 1) * kSegment - off);
      auto& v = segment_bytes_[x.file];
      if (v.size() <= k) v.resize(k + 1, 0);
      v[k] += n;
      off += n, rest -= n;
    }
}

Result<std::shared_ptr<RandomAccessFile>> Stream::file_of(size_t fi) {
  std::lock_guard lk(files_mu_);
  if (!files_[fi]) {
    WL_ASSIGN_OR_RETURN(files_[fi], open_data(plan_.files[fi], env_, direct_ ? FileMode::kDirect : FileMode::kPread));
  }
  return files_[fi];
}

void Stream::tensor_done(size_t ti) {
  std::shared_ptr<MappedFile> unmap;  // unregistered outside the lock
  std::lock_guard lk(files_mu_);
  size_t fi = plan_.tensors[ti].file;
  if (--file_pending_[fi] == 0) {
    files_[fi].reset();
    if (!mapped_files_.empty()) unmap = std::move(mapped_files_[fi]);
  }
}

Status Stream::ensure_alloc(size_t ti) {
  TensorState& st = ts_[ti];
  std::call_once(st.once, [&] {
    auto r = place(plan_.tensors[ti], dest_);
    if (r.ok())
      st.region = std::move(*r);
    else
      st.alloc_status = r.status();
  });
  return st.alloc_status;
}

Status Stream::hand_over(size_t ti) {
  const PlannedTensor& t = plan_.tensors[ti];
  Status s = d_.deliver(t, plan_.files[t.file].path, view_of(t, ts_[ti].region));
  ts_[ti].region.owner.reset();  // the delivered view holds it now
  tensor_done(ti);
  {
    std::lock_guard lk(wm_mu_);
    delivered_[ti] = 1;
    while (wm_ptr_ < order_.size() && delivered_[order_[wm_ptr_]]) ++wm_ptr_;
  }
  wm_cv_.notify_all();
  return s;
}

// `len` more bytes of tensor `ti` are in place; the last ones hand it over.
void Stream::landed(size_t ti, uint64_t len) {
  if (ts_[ti].remaining.fetch_sub(len) == len) {
    Status s = hand_over(ti);
    if (!s.ok()) d_.fail(s);
  }
}

Status Stream::hand_over_empty_tensors() {
  for (size_t ti : order_)
    if (plan_.tensors[ti].nbytes == 0) {
      WL_RETURN_IF_ERROR(ensure_alloc(ti));
      WL_RETURN_IF_ERROR(hand_over(ti));
    }
  // Without a cap, every output buffer is allocated before the workers start,
  // so no mmap/munmap (mmap_lock writers, TLB shootdowns) runs while the
  // workers fault pages in -- as far as they fit in the memory available now
  // (sizes come from the files' claims); the rest are allocated, and each
  // admitted again, as the stream reaches them.
  if (window_ == 0) {
    uint64_t room = UINT64_MAX, upfront = 0;
    if (dest_.device().host_accessible())
      if (auto avail = available_ram_bytes(system_); avail.ok()) room = *avail;
    for (size_t ti : order_) {
      if (upfront + plan_.tensors[ti].nbytes > room) break;
      upfront += plan_.tensors[ti].nbytes;
      WL_RETURN_IF_ERROR(ensure_alloc(ti), .file = plan_.files[plan_.tensors[ti].file].path);
    }
  }
  return Status();
}

// The next chunk [a, b) of the stream, once it fits in the memory window
// past the earliest tensor not yet handed over; false when the stream is
// done or the load stopped.
bool Stream::claim(uint64_t* a, uint64_t* b) {
  std::unique_lock lk(wm_mu_);
  while (true) {
    if (d_.stopped()) return false;
    uint64_t start = next_chunk_ * chunk_;
    if (start >= total_) return false;
    uint64_t end = std::min(total_, start + chunk_);
    uint64_t low = wm_ptr_ < order_.size() ? ts_[order_[wm_ptr_]].first_pos : total_;
    uint64_t low_end = wm_ptr_ < order_.size() ? ts_[order_[wm_ptr_]].end_pos : total_;
    if (window_ == 0 || end - std::min(low, end) <= window_ || start < low_end) {
      ++next_chunk_;
      *a = start, *b = end;
      return true;
    }
    wm_cv_.wait_for(lk, std::chrono::milliseconds(20));
  }
}

// The pieces of the extents that overlap the chunk [a, b), in stream order.
void Stream::pieces_of(uint64_t a, uint64_t b, std::vector<Piece>& pieces) const {
  pieces.clear();
  size_t e = static_cast<size_t>(
      std::upper_bound(ext_.begin(), ext_.end(), a, [](uint64_t v, const Extent& x) { return v < x.pos; }) -
      ext_.begin());
  if (e > 0) --e;
  for (; e < ext_.size() && ext_[e].pos < b; ++e) {
    const Extent& x = ext_[e];
    uint64_t s = std::max(a, x.pos), t = std::min(b, x.pos + x.len);
    if (s >= t) continue;
    pieces.push_back({x.file, x.tensor, x.file_off + (s - x.pos), t - s, x.dst_off + (s - x.pos)});
  }
}

void Stream::worker() {
  Buffer staging;
  if (direct_ && !device_) {
    auto b = Buffer::allocate(static_cast<size_t>(chunk_ + 2 * kAlign), kAlign);
    if (!b.ok()) return d_.fail(b.status());
    staging = std::move(*b);
  }
  std::vector<Piece> pieces;
  uint64_t a = 0, b = 0;
  while (claim(&a, &b)) {
    pieces_of(a, b, pieces);
    // Runs of pieces contiguous in one file, each read at once.
    for (size_t i = 0; i < pieces.size();) {
      size_t j = i + 1;
      while (j < pieces.size() && pieces[j].file == pieces[i].file &&
             pieces[j].file_off == pieces[j - 1].file_off + pieces[j - 1].len)
        ++j;
      Status s = read_run(std::span<const Piece>(pieces.data() + i, j - i), staging);
      if (!s.ok()) return d_.fail(s);
      i = j;
    }
  }
}

// One run: its tensors' memory first, then the read that suits where it goes.
Status Stream::read_run(std::span<const Piece> run, Buffer& staging) {
  bool to_device = false;
  for (const Piece& p : run) {
    WL_RETURN_IF_ERROR(ensure_alloc(p.tensor), .file = plan_.files[p.file].path);
    to_device |= !ts_[p.tensor].region.device.host_accessible();
  }
  WL_ASSIGN_OR_RETURN(auto fh, file_of(run.front().file));
  const RandomAccessFile& f = *fh;
  Status s;
  if (to_device && gds_) {
    s = read_direct(f, run);
  } else if (to_device && mapped_ok_.load(std::memory_order_relaxed) && read_mapped(run, &s)) {
    // queued (or failed: s) out of the page cache
  } else if (to_device) {
    WL_ASSIGN_OR_RETURN(StagingSlot slot, up_->acquire());
    s = read_staged(f, run, slot.bytes, slot);
  } else if (direct_ && f.alignment() > 1) {
    s = read_staged(f, run, staging.span(), std::nullopt);
  } else {
    s = read_scatter(f, run);
  }
  return named(std::move(s), run);
}

// A failed read names its tensor (the first of a read shared by adjacent
// ones, and the last) and its file.
Status Stream::named(Status s, std::span<const Piece> run) const {
  if (s.ok()) return s;
  const std::string& first = plan_.tensors[run.front().tensor].name;
  if (run.size() > 1 && s.tensor().empty() && run.back().tensor != run.front().tensor)
    s = Status(s.code(), fmt::format("{} (one read of {} adjacent tensors, '{}' to '{}')", s.message(), run.size(),
                                     first, plan_.tensors[run.back().tensor].name))
            .with_file(s.file());
  s.with_tensor(first);
  s.with_file(plan_.files[run.front().file].path);
  return s;
}

// GPUDirect Storage: each piece read by cuFile straight into device memory.
Status Stream::read_direct(const RandomAccessFile& f, std::span<const Piece> run) {
  for (const Piece& p : run) {
    std::byte* dst = ts_[p.tensor].region.data + p.dst_off;
    Status s = ts_[p.tensor].region.device.host_accessible() ? f.read_at(p.file_off, std::span(dst, p.len))
                                                             : up_->direct_reads()->read(f, p.file_off, dst, p.len);
    WL_RETURN_IF_ERROR(s, .tensor = plan_.tensors[p.tensor].name);
    bytes_read_ += p.len;
    landed(p.tensor, p.len);
  }
  return Status();
}

// One aligned read of the run into `buf`, then copied (host) or uploaded
// (device, `slot` of the uploader's ring) to its tensors.
Status Stream::read_staged(const RandomAccessFile& f, std::span<const Piece> run, std::span<std::byte> buf,
                           std::optional<StagingSlot> slot) {
  const uint64_t off = run.front().file_off, end = run.back().file_off + run.back().len;
  uint64_t a0 = off, a1 = end;
  if (f.alignment() > 1) {
    a0 = off & ~(kAlign - 1);
    a1 = std::min<uint64_t>((end + kAlign - 1) & ~(kAlign - 1), f.size());
  }
  if (a1 - a0 > buf.size()) {
    if (slot) up_->release(*slot);
    return Status::Internal(
        fmt::format("run of {} bytes at {} exceeds the {}-byte staging buffer", a1 - a0, a0, buf.size()));
  }
  Status s = f.read_at(a0, buf.first(static_cast<size_t>(a1 - a0)));
  if (!s.ok()) {
    if (slot) up_->release(*slot);
    return s;
  }
  bytes_read_ += a1 - a0;
  std::vector<UploadCopy> copies;
  std::vector<std::pair<uint32_t, uint64_t>> uploaded;  // (tensor, bytes) completed by the copies
  for (const Piece& p : run) {
    const Region& r = ts_[p.tensor].region;
    if (r.device.host_accessible()) {
      std::memcpy(r.data + p.dst_off, buf.data() + (p.file_off - a0), p.len);
      landed(p.tensor, p.len);
    } else {
      copies.push_back({p.file_off - a0, r.data + p.dst_off, p.len});
      uploaded.emplace_back(p.tensor, p.len);
    }
  }
  if (!slot) return Status();
  if (copies.empty()) {
    up_->release(*slot);
    return Status();
  }
  return up_->submit(*slot, copies, [this, uploaded = std::move(uploaded)](Status st) {
    if (!st.ok()) return d_.fail(st);
    for (auto [ti, len] : uploaded) landed(ti, len);
  });
}

// One scatter read per run straight into the tensors' memory: a single
// ranged GET on a remote source however many small tensors lie side by side.
Status Stream::read_scatter(const RandomAccessFile& f, std::span<const Piece> run) {
  std::vector<std::span<std::byte>> dsts;
  dsts.reserve(run.size());
  uint64_t len = 0;
  for (const Piece& p : run) {
    dsts.emplace_back(ts_[p.tensor].region.data + p.dst_off, p.len);
    len += p.len;
  }
  WL_RETURN_IF_ERROR(f.read_scatter_at(run.front().file_off, dsts));
  bytes_read_ += len;
  for (const Piece& p : run) landed(p.tensor, p.len);
  return Status();
}

// The file's read-only mapping for copies out of the page cache; null when
// it cannot be mapped (the run then goes through a slot).
std::shared_ptr<MappedFile> Stream::mapped_of(size_t fi) {
  std::lock_guard lk(files_mu_);
  auto& m = mapped_files_[fi];
  if (!m) {
    auto f = open_data(plan_.files[fi], env_, FileMode::kMmap);
    if (!f.ok()) return nullptr;
    auto all = (*f)->view(0, (*f)->size());
    if (!all.ok() || all->empty()) return nullptr;
    m = std::make_shared<MappedFile>();
    m->map = std::move(*f);
    m->base = all->data();
    m->size = all->size();
    m->up = host_;
    const size_t segs = static_cast<size_t>((m->size + kSegment - 1) / kSegment);
    m->seg.assign(segs, 0);
    m->left = std::vector<std::atomic<uint64_t>>(segs);
    for (size_t k = 0; k < segs && k < segment_bytes_[fi].size(); ++k) m->left[k] = segment_bytes_[fi][k];
  }
  return m;
}

// A run copied to the device out of the file's registered mapping; false
// (nothing queued) when the mapping or its registration is not to be had.
bool Stream::read_mapped(std::span<const Piece> run, Status* out) {
  std::shared_ptr<MappedFile> mf = mapped_of(run.front().file);
  if (!mf) return false;
  std::vector<HostCopy> copies;
  std::vector<std::pair<size_t, uint64_t>> segs;        // (segment, bytes) of each copy
  std::vector<std::pair<uint32_t, uint64_t>> uploaded;  // (tensor, bytes)
  uint64_t len = 0;
  for (const Piece& p : run) {
    const Region& r = ts_[p.tensor].region;
    if (r.device.host_accessible() || p.file_off + p.len > mf->size) return false;
    for (uint64_t off = p.file_off, dst = p.dst_off, rest = p.len; rest > 0;) {
      const size_t k = static_cast<size_t>(off / kSegment);
      const uint64_t n = std::min(rest, std::min<uint64_t>((k + 1) * kSegment, mf->size) - off);
      if (Status s = mf->ensure(k); !s.ok()) {
        if (mapped_ok_.exchange(false) && log_)
          log_("stream: registering the page cache for DMA failed (" + s.message() +
               "); staging through the pinned ring instead");
        return false;
      }
      copies.push_back({mf->base + off, r.data + dst, n});
      segs.emplace_back(k, n);
      off += n, dst += n, rest -= n;
    }
    uploaded.emplace_back(p.tensor, p.len);
    len += p.len;
  }
  *out = host_->submit_host(copies, [this, mf, segs = std::move(segs), uploaded = std::move(uploaded)](Status st) {
    for (auto [k, n] : segs) mf->copied(k, n);
    if (!st.ok()) return d_.fail(st);
    for (auto [ti, n] : uploaded) landed(ti, n);
  });
  if (out->ok()) bytes_read_ += len;
  return true;
}

Status Stream::read_in_parallel() {
  std::vector<std::thread> pool;
  for (int i = 0; i < threads_; ++i)
    pool.emplace_back([this] {
      try {  // nothing thrown may leave a thread (std::bad_alloc of a vector included)
        worker();
      } catch (const std::exception& e) {
        d_.fail(Status::OutOfRange(std::string("stream worker: ") + e.what()));
      }
    });
  for (auto& t : pool) t.join();
  if (up_) {
    Status f = up_->flush();
    if (!f.ok()) d_.fail(f);
  }
  return d_.status();
}

// Tensors whose storage is not one contiguous range (some PyTorch views).
Status Stream::read_strided_tensors() {
  for (size_t ti : late_) {
    const PlannedTensor& t = plan_.tensors[ti];
    const PlanFile& pf = plan_.files[t.file];
    WL_ASSIGN_OR_RETURN(CheckpointReader * reader, reader_of(pf, env_));
    WL_ASSIGN_OR_RETURN(TensorView full, reader->view(t.index), .tensor = t.name, .file = pf.path);
    WL_ASSIGN_OR_RETURN(Region r, place(t, dest_), .file = pf.path);
    WL_RETURN_IF_ERROR(copy_shard(dest_, t, r, full.bytes()), .tensor = t.name, .file = pf.path);
    bytes_read_ += t.nbytes;
    WL_RETURN_IF_ERROR(d_.deliver(t, pf.path, view_of(t, r)));
  }
  return Status();
}

void Stream::finish(LoadStats& stats) {
  for (size_t fi = 0; fi < plan_.files.size(); ++fi) d_.file_done();
  stats.bytes_read = bytes_read_.load();
  stats.direct_io = direct_;
  stats.gds = gds_;
  stats.host_registered = mapped_;
}

}  // namespace

Status run_stream(const LoadPlan& plan, Delivery& d, LoadStats& stats) {
  const LoadPlan::Body& b = plan.body();
  Stream s(b, destination_of(b), d);
  WL_RETURN_IF_ERROR(s.check_destination());
  s.lay_out();
  s.begin();
  s.map_segments();
  WL_RETURN_IF_ERROR(s.hand_over_empty_tensors());
  WL_RETURN_IF_ERROR(s.read_in_parallel());
  WL_RETURN_IF_ERROR(s.read_strided_tensors());
  s.finish(stats);
  return Status();
}

}  // namespace wl::engine

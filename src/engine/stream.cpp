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
constexpr uint64_t kDefaultChunk = uint64_t{8} << 20;
// Remote sources: requests in flight (each a ranged GET of up to one chunk).
constexpr int kRemoteThreads = 16;

struct Extent {
  uint64_t pos;       // stream position
  uint64_t file_off;
  uint64_t len;
  uint64_t dst_off;   // inside the tensor's bytes
  uint32_t file;
  uint32_t tensor;    // index into Plan::tensors
};

struct TensorState {
  std::atomic<uint64_t> remaining{0};
  std::once_flag once;
  Status alloc_status;
  Region region;
  uint64_t first_pos = 0, end_pos = 0;
};

struct Piece {
  uint32_t file, tensor;
  uint64_t file_off, len, dst_off;
};

}  // namespace

Status run_stream(Plan& plan, const LoadOptions& o, const ReadPath& path, Destination& dest, Delivery& d,
                  LoadStats& stats) {
  int threads = o.threads > 0 ? o.threads : 8;
  uint64_t chunk = o.block_size > 0 ? o.block_size : kDefaultChunk;
  Uploader* up = dest.uploader();
  const bool device = !dest.device().host_accessible();
  if (device && up == nullptr)
    return Status::InvalidArgument(fmt::format("a {} destination needs an uploader", dest.device().to_string()));

  // Layout of the stream.
  std::vector<Extent> ext;
  std::vector<size_t> late;  // tensors without contiguous storage: read through the reader
  std::vector<size_t> order; // tensors in stream order
  uint64_t pos = 0;
  std::vector<TensorState> ts(plan.tensors.size());
  for (size_t fi = 0; fi < plan.files.size(); ++fi) {
    for (size_t ti : plan.files[fi].tensors) {
      const PlannedTensor& t = plan.tensors[ti];
      if (!t.file_offset) {
        late.push_back(ti);
        continue;
      }
      ts[ti].first_pos = pos;
      if (t.nbytes == 0) {
        order.push_back(ti);
        ts[ti].end_pos = pos;
        continue;
      }
      auto add = [&](uint64_t off, uint64_t len, uint64_t dst_off) {
        ext.push_back({pos, off, len, dst_off, static_cast<uint32_t>(fi), static_cast<uint32_t>(ti)});
        pos += len;
      };
      if (!t.shard) {
        add(*t.file_offset, t.nbytes, 0);
      } else {
        const ShardLayout& l = *t.shard;
        for (uint64_t i = 0; i < l.outer; ++i) add(*t.file_offset + l.first + i * l.stride, l.run, i * l.run);
      }
      ts[ti].remaining.store(t.nbytes);
      ts[ti].end_pos = pos;
      order.push_back(ti);
    }
  }
  const uint64_t total = pos;

  // GPUDirect Storage: decided once, before any tensor is handed over (the
  // zero-byte ones below included), from the first file (choose()); false
  // stages every read through the ring for the whole load.
  const bool gds = device && path.gds;
  if (device && !plan.files.empty()) up->direct_chosen(gds, path.gds_off);
  // A stopped load (an error, a cancel) wakes readers waiting for a slot.
  if (up) d.on_stop([up] { up->cancel(); });

  // O_DIRECT as choose() decided (never for a remote source: it has no pages).
  const bool remote = !plan.files.empty() && is_url(plan.files[0].path);
  const bool direct = path.direct;
  // Files open on first use (the planned version, else kAborted) and close
  // once their last tensor is handed over, so thousands of shards never hold
  // thousands of descriptors.
  std::mutex files_mu;
  std::vector<std::shared_ptr<RandomAccessFile>> files(plan.files.size());
  std::vector<size_t> file_pending(plan.files.size(), 0);
  for (size_t ti : order) file_pending[plan.tensors[ti].file]++;
  auto file_of = [&](size_t fi) -> Result<std::shared_ptr<RandomAccessFile>> {
    std::lock_guard lk(files_mu);
    if (!files[fi]) {
      WL_ASSIGN_OR_RETURN(files[fi], open_data(plan.files[fi], o.env, direct ? FileMode::kDirect : FileMode::kPread));
    }
    return files[fi];
  };
  auto tensor_done = [&](size_t ti) {
    std::lock_guard lk(files_mu);
    size_t fi = plan.tensors[ti].file;
    if (--file_pending[fi] == 0) files[fi].reset();
  };
  stats.direct_io = direct;
  stats.gds = gds;

  // Buffered reads out of a warm page cache are memory copies: more threads
  // than cores only contend. O_DIRECT keeps 8 reads in flight.
  if (o.threads == 0 && !direct)
    threads = remote ? kRemoteThreads : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);

  // Memory: staging (direct only; a device destination stages in its own
  // ring) plus the window of allocated, undelivered tensors.
  uint64_t window = 0;  // 0: unlimited
  const uint64_t max_memory = path.max_memory;
  if (max_memory > 0) {
    if (direct && !device) {
      uint64_t per = max_memory / 2 / static_cast<uint64_t>(threads);
      while (per < (uint64_t{1} << 20) + 2 * kAlign && threads > 1) per = max_memory / 2 / static_cast<uint64_t>(--threads);
      chunk = std::min(chunk, per > 2 * kAlign ? per - 2 * kAlign : kAlign);
      chunk = std::max<uint64_t>(chunk & ~(kAlign - 1), kAlign);
      uint64_t staging = static_cast<uint64_t>(threads) * (chunk + 2 * kAlign);
      window = max_memory > staging ? max_memory - staging : 1;
    } else {
      window = max_memory;
      chunk = std::min<uint64_t>(chunk, std::max<uint64_t>(window / 2, kAlign));
    }
  }
  if (device) {
    const uint64_t slot = up->slot_bytes();
    if (slot < 4 * kAlign) return Status::InvalidArgument(fmt::format("uploader slots of {} bytes are too small", slot));
    chunk = std::min<uint64_t>(chunk, (slot - 2 * kAlign) & ~(kAlign - 1));
  }
  if (total > 0) threads = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), (total + chunk - 1) / chunk));
  if (o.log)
    o.log(fmt::format("stream: {} threads, {} KiB reads, {}, to {}, memory cap {}", threads, chunk >> 10,
                      direct ? "O_DIRECT" : "buffered", dest.device().to_string(),
                      max_memory ? fmt::format("{} MiB", max_memory >> 20) : "none"));

  // Watermark: stream position of the earliest tensor not yet handed over.
  std::mutex wm_mu;
  std::condition_variable wm_cv;
  std::vector<char> delivered(plan.tensors.size(), 0);
  size_t wm_ptr = 0;
  uint64_t next_chunk = 0;
  std::atomic<uint64_t> bytes_read{0};

  auto hand_over = [&](size_t ti) -> Status {
    Status s = d.deliver(plan.tensors[ti], plan.files[plan.tensors[ti].file].path, view_of(plan.tensors[ti], ts[ti].region));
    ts[ti].region.owner.reset();  // the delivered view holds it now
    tensor_done(ti);
    {
      std::lock_guard lk(wm_mu);
      delivered[ti] = 1;
      while (wm_ptr < order.size() && delivered[order[wm_ptr]]) ++wm_ptr;
    }
    wm_cv.notify_all();
    return s;
  };
  // `len` more bytes of tensor `ti` are in place; the last ones hand it over.
  auto landed = [&](size_t ti, uint64_t len) {
    if (ts[ti].remaining.fetch_sub(len) == len) {
      Status s = hand_over(ti);
      if (!s.ok()) d.fail(s);
    }
  };
  auto ensure_alloc = [&](size_t ti) -> Status {
    TensorState& st = ts[ti];
    std::call_once(st.once, [&] {
      auto r = place(plan.tensors[ti], dest);
      if (r.ok()) st.region = std::move(*r);
      else st.alloc_status = r.status();
    });
    return st.alloc_status;
  };

  // Zero-byte tensors need no reads.
  for (size_t ti : order)
    if (plan.tensors[ti].nbytes == 0) {
      WL_RETURN_IF_ERROR(ensure_alloc(ti));
      WL_RETURN_IF_ERROR(hand_over(ti));
    }

  // Without a cap, every output buffer is allocated before the workers start,
  // so no mmap/munmap (mmap_lock writers, TLB shootdowns) runs while the
  // workers fault pages in -- as far as they fit in the memory available now
  // (sizes come from the files' claims); the rest are allocated, and each
  // admitted again, as the stream reaches them.
  if (window == 0) {
    uint64_t room = UINT64_MAX, upfront = 0;
    if (dest.device().host_accessible())
      if (auto avail = available_ram_bytes(o.system); avail.ok()) room = *avail;
    for (size_t ti : order) {
      if (upfront + plan.tensors[ti].nbytes > room) break;
      upfront += plan.tensors[ti].nbytes;
      Status s = ensure_alloc(ti);
      if (!s.ok()) return std::move(s).with_file(plan.files[plan.tensors[ti].file].path);
    }
  }

  auto claim = [&](uint64_t* a, uint64_t* b) -> bool {
    std::unique_lock lk(wm_mu);
    while (true) {
      if (d.stopped()) return false;
      uint64_t start = next_chunk * chunk;
      if (start >= total) return false;
      uint64_t end = std::min(total, start + chunk);
      uint64_t low = wm_ptr < order.size() ? ts[order[wm_ptr]].first_pos : total;
      uint64_t low_end = wm_ptr < order.size() ? ts[order[wm_ptr]].end_pos : total;
      if (window == 0 || end - std::min(low, end) <= window || start < low_end) {
        ++next_chunk;
        *a = start, *b = end;
        return true;
      }
      wm_cv.wait_for(lk, std::chrono::milliseconds(20));
    }
  };

  // One run: pieces contiguous in one file, read with one aligned read into
  // `buf`, then copied (host) or uploaded (device) to their tensors.
  auto staged_run = [&](const RandomAccessFile& f, std::span<const Piece> run, std::span<std::byte> buf,
                        std::optional<StagingSlot> slot) -> Status {
    const uint64_t off = run.front().file_off, end = run.back().file_off + run.back().len;
    uint64_t a0 = off, a1 = end;
    if (f.alignment() > 1) {
      a0 = off & ~(kAlign - 1);
      a1 = std::min<uint64_t>((end + kAlign - 1) & ~(kAlign - 1), f.size());
    }
    if (a1 - a0 > buf.size()) {
      if (slot) up->release(*slot);
      return Status::Internal(fmt::format("run of {} bytes at {} exceeds the {}-byte staging buffer", a1 - a0, a0, buf.size()));
    }
    Status s = f.read_at(a0, buf.first(static_cast<size_t>(a1 - a0)));
    if (!s.ok()) {
      if (slot) up->release(*slot);
      return s;
    }
    bytes_read += a1 - a0;
    std::vector<UploadCopy> copies;
    std::vector<std::pair<uint32_t, uint64_t>> uploaded;  // (tensor, bytes) completed by the copies
    for (const Piece& p : run) {
      const Region& r = ts[p.tensor].region;
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
      up->release(*slot);
      return Status();
    }
    return up->submit(*slot, copies, [&, uploaded = std::move(uploaded)](Status st) {
      if (!st.ok()) return d.fail(st);
      for (auto [ti, len] : uploaded) landed(ti, len);
    });
  };

  auto worker = [&]() {
    Buffer staging;
    if (direct && !device) {
      auto b = Buffer::allocate(static_cast<size_t>(chunk + 2 * kAlign), kAlign);
      if (!b.ok()) return d.fail(b.status());
      staging = std::move(*b);
    }
    std::vector<Piece> pieces;
    uint64_t a = 0, b = 0;
    while (claim(&a, &b)) {
      pieces.clear();
      size_t e = static_cast<size_t>(
          std::upper_bound(ext.begin(), ext.end(), a, [](uint64_t v, const Extent& x) { return v < x.pos; }) -
          ext.begin());
      if (e > 0) --e;
      for (; e < ext.size() && ext[e].pos < b; ++e) {
        const Extent& x = ext[e];
        uint64_t s = std::max(a, x.pos), t = std::min(b, x.pos + x.len);
        if (s >= t) continue;
        pieces.push_back({x.file, x.tensor, x.file_off + (s - x.pos), t - s, x.dst_off + (s - x.pos)});
      }
      for (size_t i = 0; i < pieces.size();) {
        size_t j = i + 1;
        while (j < pieces.size() && pieces[j].file == pieces[i].file &&
               pieces[j].file_off == pieces[j - 1].file_off + pieces[j - 1].len)
          ++j;
        bool to_device = false;
        for (size_t k = i; k < j; ++k) {
          Status s = ensure_alloc(pieces[k].tensor);
          if (!s.ok()) return d.fail(Status(s).with_file(plan.files[pieces[k].file].path));
          to_device |= !ts[pieces[k].tensor].region.device.host_accessible();
        }
        auto fh = file_of(pieces[i].file);
        if (!fh.ok()) return d.fail(fh.status());
        const RandomAccessFile& f = **fh;
        std::span<const Piece> run(pieces.data() + i, j - i);
        Status s;
        if (to_device && gds) {
          for (const Piece& p : run) {
            std::byte* dst = ts[p.tensor].region.data + p.dst_off;
            s = ts[p.tensor].region.device.host_accessible() ? f.read_at(p.file_off, std::span(dst, p.len))
                                                               : up->read_direct(f, p.file_off, dst, p.len);
            if (!s.ok()) {
              s.with_tensor(plan.tensors[p.tensor].name);
              break;
            }
            bytes_read += p.len;
            landed(p.tensor, p.len);
          }
        } else if (to_device) {
          auto slot = up->acquire();
          if (!slot.ok()) return d.fail(slot.status());
          s = staged_run(f, run, slot->bytes, *slot);
        } else if (direct && f.alignment() > 1) {
          s = staged_run(f, run, staging.span(), std::nullopt);
        } else {
          // One scatter read per run: a single ranged GET on a remote source
          // however many small tensors lie side by side.
          std::vector<std::span<std::byte>> dsts;
          dsts.reserve(run.size());
          uint64_t len = 0;
          for (const Piece& p : run) {
            dsts.emplace_back(ts[p.tensor].region.data + p.dst_off, p.len);
            len += p.len;
          }
          s = f.read_scatter_at(run.front().file_off, dsts);
          if (s.ok()) {
            bytes_read += len;
            for (const Piece& p : run) landed(p.tensor, p.len);
          }
        }
        if (!s.ok()) {  // name the tensor (the first of a read shared by adjacent ones) and the file
          const std::string& first = plan.tensors[run.front().tensor].name;
          if (run.size() > 1 && s.tensor().empty() && run.back().tensor != run.front().tensor)
            s = Status(s.code(), fmt::format("{} (one read of {} adjacent tensors, '{}' to '{}')", s.message(),
                                             run.size(), first, plan.tensors[run.back().tensor].name))
                    .with_file(s.file());
          s.with_tensor(first);
          s.with_file(plan.files[run.front().file].path);
          return d.fail(s);
        }
        i = j;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back([&] {
      try {  // nothing thrown may leave a thread (std::bad_alloc of a vector included)
        worker();
      } catch (const std::exception& e) {
        d.fail(Status::OutOfRange(std::string("stream worker: ") + e.what()));
      }
    });
  for (auto& t : pool) t.join();
  if (up) {
    Status f = up->flush();
    if (!f.ok()) d.fail(f);
  }
  WL_RETURN_IF_ERROR(d.status());

  // Tensors whose storage is not one contiguous range (some PyTorch views).
  for (size_t ti : late) {
    const PlannedTensor& t = plan.tensors[ti];
    PlanFile& pf = plan.files[t.file];
    WL_ASSIGN_OR_RETURN(CheckpointReader * reader, reader_of(pf, o.env));
    auto full = reader->view(t.index);
    if (!full.ok()) return Status(full.status()).with_tensor(t.name).with_file(pf.path);
    auto r = place(t, dest);
    if (!r.ok()) return Status(r.status()).with_file(pf.path);
    Status s = copy_shard(dest, t, *r, full->bytes());
    if (!s.ok()) return std::move(s).with_tensor(t.name).with_file(pf.path);
    bytes_read += t.nbytes;
    WL_RETURN_IF_ERROR(d.deliver(t, pf.path, view_of(t, *r)));
  }
  for (size_t fi = 0; fi < plan.files.size(); ++fi) d.file_done();
  stats.bytes_read = bytes_read.load();
  return Status();
}

}  // namespace wl::engine

// The stream strategy: every selected byte range of every file, laid end to
// end as one stream, cut into chunks that N I/O threads claim in order. A
// tensor is handed over the moment its last byte lands. With O_DIRECT, each
// chunk is read aligned into a per-thread staging buffer and copied into the
// tensors' own buffers (never handed out); buffered reads go straight into them.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/plan.h"

namespace wl::engine {

namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kDefaultChunk = uint64_t{8} << 20;

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
  std::span<std::byte> dst;
  TensorView view;
  uint64_t first_pos = 0, end_pos = 0;
};

// Fraction of a sample of the file's pages that sit in the page cache (0..1), or -1.
double residency(int fd, uint64_t size) {
  if (fd < 0 || size == 0) return -1;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (size + page - 1) / page;
  const uint64_t samples = std::min<uint64_t>(pages, 256);
  uint64_t hits = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    uint64_t pg = i * pages / samples;
    unsigned char v = 0;
    if (::mincore(static_cast<char*>(p) + pg * page, page, &v) == 0 && (v & 1)) ++hits;
  }
  ::munmap(p, size);
  return static_cast<double>(hits) / static_cast<double>(samples);
}

}  // namespace

Status run_stream(Plan& plan, const LoadOptions& o, Delivery& d, LoadStats& stats) {
  int threads = o.threads > 0 ? o.threads : 8;
  uint64_t chunk = o.block_size > 0 ? o.block_size : kDefaultChunk;

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

  // Choose O_DIRECT from a sample of the first files' pages.
  bool direct = o.direct == DirectIo::kOn;
  if (o.direct == DirectIo::kAuto) {
    double hits = 0;
    int n = 0;
    for (size_t fi = 0; fi < plan.files.size() && fi < 8; ++fi) {
      WL_ASSIGN_OR_RETURN(auto f, o.env->open(plan.files[fi].path, {.mode = FileMode::kPread}));
      double r = residency(f->fd(), f->size());
      if (r >= 0) hits += r, ++n;
    }
    direct = n > 0 && hits / n < 0.5;
  }
  // Files open on first use and close once their last tensor is handed over,
  // so thousands of shards never hold thousands of descriptors.
  std::mutex files_mu;
  std::vector<std::shared_ptr<RandomAccessFile>> files(plan.files.size());
  std::vector<size_t> file_pending(plan.files.size(), 0);
  for (size_t ti : order) file_pending[plan.tensors[ti].file]++;
  auto file_of = [&](size_t fi) -> Result<std::shared_ptr<RandomAccessFile>> {
    std::lock_guard lk(files_mu);
    if (!files[fi]) {
      WL_ASSIGN_OR_RETURN(files[fi], o.env->open(plan.files[fi].path,
                                                 {.mode = direct ? FileMode::kDirect : FileMode::kPread}));
    }
    return files[fi];
  };
  auto tensor_done = [&](size_t ti) {
    std::lock_guard lk(files_mu);
    size_t fi = plan.tensors[ti].file;
    if (--file_pending[fi] == 0) files[fi].reset();
  };
  stats.direct_io = direct;

  // Buffered reads out of a warm page cache are memory copies: more threads
  // than cores only contend. O_DIRECT keeps 8 reads in flight.
  if (o.threads == 0 && !direct)
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);

  // Memory: staging (direct only) plus the window of allocated, undelivered tensors.
  uint64_t window = 0;  // 0: unlimited
  if (o.max_memory > 0) {
    if (direct) {
      uint64_t per = o.max_memory / 2 / static_cast<uint64_t>(threads);
      while (per < (uint64_t{1} << 20) + 2 * kAlign && threads > 1) per = o.max_memory / 2 / static_cast<uint64_t>(--threads);
      chunk = std::min(chunk, per > 2 * kAlign ? per - 2 * kAlign : kAlign);
      chunk = std::max<uint64_t>(chunk & ~(kAlign - 1), kAlign);
      uint64_t staging = static_cast<uint64_t>(threads) * (chunk + 2 * kAlign);
      window = o.max_memory > staging ? o.max_memory - staging : 1;
    } else {
      window = o.max_memory;
      chunk = std::min<uint64_t>(chunk, std::max<uint64_t>(window / 2, kAlign));
    }
  }
  if (total > 0) threads = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(threads), (total + chunk - 1) / chunk));
  if (o.log)
    o.log(fmt::format("stream: {} threads, {} KiB reads, {}, memory cap {}", threads, chunk >> 10,
                      direct ? "O_DIRECT" : "buffered", o.max_memory ? fmt::format("{} MiB", o.max_memory >> 20) : "none"));

  // Watermark: stream position of the earliest tensor not yet handed over.
  std::mutex wm_mu;
  std::condition_variable wm_cv;
  std::vector<char> delivered(plan.tensors.size(), 0);
  size_t wm_ptr = 0;
  uint64_t next_chunk = 0;
  std::atomic<uint64_t> bytes_read{0};

  auto hand_over = [&](size_t ti) -> Status {
    TensorView v = std::move(ts[ti].view);
    ts[ti].view = TensorView();
    Status s = d.deliver(plan.tensors[ti], plan.files[plan.tensors[ti].file].path, std::move(v));
    tensor_done(ti);
    {
      std::lock_guard lk(wm_mu);
      delivered[ti] = 1;
      while (wm_ptr < order.size() && delivered[order[wm_ptr]]) ++wm_ptr;
    }
    wm_cv.notify_all();
    return s;
  };
  auto ensure_alloc = [&](size_t ti) -> Status {
    TensorState& st = ts[ti];
    std::call_once(st.once, [&] {
      auto v = materialize(plan.tensors[ti], o, [&](std::span<std::byte> dst) {
        st.dst = dst;
        return Status();
      });
      if (v.ok()) st.view = std::move(*v);
      else st.alloc_status = v.status();
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
  // workers fault pages in.
  if (window == 0)
    for (size_t ti : order) WL_RETURN_IF_ERROR(ensure_alloc(ti));

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

  struct Piece {
    uint32_t file, tensor;
    uint64_t file_off, len, dst_off;
  };

  auto worker = [&]() {
    Buffer staging;
    if (direct) {
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
        // A run: pieces contiguous in the same file.
        size_t j = i + 1;
        while (j < pieces.size() && pieces[j].file == pieces[i].file &&
               pieces[j].file_off == pieces[j - 1].file_off + pieces[j - 1].len)
          ++j;
        for (size_t k = i; k < j; ++k) {
          Status s = ensure_alloc(pieces[k].tensor);
          if (!s.ok()) return d.fail(Status(s).with_file(plan.files[pieces[k].file].path));
        }
        auto fh = file_of(pieces[i].file);
        if (!fh.ok()) return d.fail(fh.status());
        const RandomAccessFile& f = **fh;
        if (direct && f.alignment() > 1) {
          uint64_t off = pieces[i].file_off, end = pieces[j - 1].file_off + pieces[j - 1].len;
          uint64_t a0 = off & ~(kAlign - 1);
          uint64_t a1 = std::min<uint64_t>((end + kAlign - 1) & ~(kAlign - 1), f.size());
          if (a1 - a0 > staging.size())
            return d.fail(Status::Internal(fmt::format("run of {} bytes at {} exceeds the {}-byte staging buffer", a1 - a0,
                                                       a0, staging.size())));
          Status s = f.read_at(a0, staging.span().first(static_cast<size_t>(a1 - a0)));
          if (!s.ok()) return d.fail(s);
          bytes_read += a1 - a0;
          for (size_t k = i; k < j; ++k)
            std::memcpy(ts[pieces[k].tensor].dst.data() + pieces[k].dst_off, staging.data() + (pieces[k].file_off - a0),
                        pieces[k].len);
        } else {
          for (size_t k = i; k < j; ++k) {
            std::span<std::byte> dst = ts[pieces[k].tensor].dst.subspan(pieces[k].dst_off, pieces[k].len);
            Status s = f.read_at(pieces[k].file_off, dst);
            if (!s.ok()) return d.fail(Status(s).with_tensor(plan.tensors[pieces[k].tensor].name));
            bytes_read += pieces[k].len;
          }
        }
        for (size_t k = i; k < j; ++k) {
          if (ts[pieces[k].tensor].remaining.fetch_sub(pieces[k].len) == pieces[k].len) {
            Status s = hand_over(pieces[k].tensor);
            if (!s.ok()) return d.fail(s);
          }
        }
        i = j;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  WL_RETURN_IF_ERROR(d.status());

  // Tensors whose storage is not one contiguous range (some PyTorch views).
  for (size_t ti : late) {
    const PlannedTensor& t = plan.tensors[ti];
    PlanFile& pf = plan.files[t.file];
    WL_ASSIGN_OR_RETURN(CheckpointReader * reader, reader_of(pf, o.env));
    auto full = reader->view(t.index);
    if (!full.ok()) return Status(full.status()).with_tensor(t.name).with_file(pf.path);
    auto v = materialize(t, o, [&](std::span<std::byte> dst) -> Status {
      if (!t.shard) {
        std::memcpy(dst.data(), full->data(), dst.size());
        return Status();
      }
      const ShardLayout& l = *t.shard;
      for (uint64_t i = 0; i < l.outer; ++i) std::memcpy(dst.data() + i * l.run, full->data() + l.first + i * l.stride, l.run);
      return Status();
    });
    if (!v.ok()) return Status(v.status()).with_file(pf.path);
    bytes_read += t.nbytes;
    WL_RETURN_IF_ERROR(d.deliver(t, pf.path, std::move(*v)));
  }
  for (size_t fi = 0; fi < plan.files.size(); ++fi) d.file_done();
  stats.bytes_read = bytes_read.load();
  return Status();
}

}  // namespace wl::engine

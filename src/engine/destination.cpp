// The host destinations (engine-owned buffers, the caller's memory, the
// caller's memory faulted in ahead: Prefaulter) and putting bytes into any
// destination's regions (destination.h).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "weightlift/destination.h"
#include "weightlift/switches.h"

namespace wl {

namespace {

class HostDestination final : public Destination {
 public:
  Device device() const override { return kCpu; }
  Result<Region> allocate(const TensorRequest& req) override {
    WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(req.nbytes)), .tensor = req.name);
    auto owner = std::make_shared<Buffer>(std::move(b));
    return Region{owner->data(), req.nbytes, kCpu, owner};
  }
};

// The caller's host memory the engine is about to fill is usually fresh
// (vLLM's parameters: allocated while the model is built, never touched).
// WEIGHTLIFT_CALLER_HUGE_PAGES=1 advises its 2 MiB-aligned interior for
// transparent huge pages before the first write (one fault per 2 MiB instead
// of per 4 KiB). Off by default: on the VM bench/vllm runs on, a fresh huge
// page costs more per byte than 4 KiB ones (direct compaction, the host
// backing 2 MiB at once): bench/vllm/machine.py measures both.
bool huge_pages_on() {
  static const bool on = read_switches().caller_huge_pages;
  return on;
}

void advise_huge_pages(std::byte* data, uint64_t size) {
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto a = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const auto b = (reinterpret_cast<uintptr_t>(data) + size) & ~(kHuge - 1);
  if (a < b) (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
}

class CallerDestination final : public Destination {
 public:
  CallerDestination(RegionFn fn, Device device, Uploader* up) : fn_(std::move(fn)), device_(device), up_(up) {}
  Device device() const override { return device_; }
  Result<Region> allocate(const TensorRequest& req) override {
    WL_ASSIGN_OR_RETURN(Region r, fn_(req));
    if (r.device.host_accessible() && r.data != nullptr && huge_pages_on()) advise_huge_pages(r.data, r.size);
    return r;
  }
  Uploader* uploader() override { return up_; }

 private:
  RegionFn fn_;
  Device device_;
  Uploader* up_;
};

// Faults in [data, data+size) writable without writing (page-aligned interior).
void populate_write(std::byte* data, uint64_t size) {
#ifdef MADV_POPULATE_WRITE
  constexpr uintptr_t kPage = 4096;
  const auto a = (reinterpret_cast<uintptr_t>(data) + kPage - 1) & ~(kPage - 1);
  const auto b = (reinterpret_cast<uintptr_t>(data) + size) & ~(kPage - 1);
  if (a < b) (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_POPULATE_WRITE);
#else
  (void)data, (void)size;
#endif
}

}  // namespace

struct Prefaulter::State {
  bool huge = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<std::byte*, uint64_t>> queue;
  bool stopping = false;
  std::atomic<uint64_t> queued{0}, done{0};
  std::thread worker;
};

Prefaulter::Prefaulter(bool huge_pages) : s_(std::make_shared<State>()) {
  s_->huge = huge_pages;
  s_->worker = std::thread([s = s_.get()] {
    // Ranges of at most 8 MiB at a time, so that stop() is prompt.
    constexpr uint64_t kStep = uint64_t{8} << 20;
    for (;;) {
      std::pair<std::byte*, uint64_t> r;
      {
        std::unique_lock lk(s->mu);
        s->cv.wait(lk, [&] { return s->stopping || !s->queue.empty(); });
        if (s->stopping) return;
        r = s->queue.front();
        s->queue.pop_front();
      }
      if (s->huge) advise_huge_pages(r.first, r.second);
      for (uint64_t off = 0; off < r.second; off += kStep) {
        if (off > 0) {
          std::lock_guard lk(s->mu);
          if (s->stopping) return;
        }
        const uint64_t n = std::min(kStep, r.second - off);
        populate_write(r.first + off, n);
        s->done += n;
      }
    }
  });
}

Prefaulter::~Prefaulter() { stop(); }

void Prefaulter::add(std::byte* data, uint64_t size) {
  if (data == nullptr || size == 0) return;
  std::lock_guard lk(s_->mu);
  if (s_->stopping) return;
  s_->queue.emplace_back(data, size);
  s_->queued += size;
  s_->cv.notify_one();
}

void Prefaulter::stop() {
  {
    std::lock_guard lk(s_->mu);
    s_->stopping = true;
    s_->cv.notify_all();
  }
  if (s_->worker.joinable()) s_->worker.join();
}

uint64_t Prefaulter::bytes_queued() const { return s_->queued.load(); }
uint64_t Prefaulter::bytes_done() const { return s_->done.load(); }

std::unique_ptr<Destination> host_destination() { return std::make_unique<HostDestination>(); }

std::unique_ptr<Destination> caller_destination(RegionFn fn, Device device, Uploader* uploader) {
  return std::make_unique<CallerDestination>(std::move(fn), device, uploader);
}

// ---- PendingCopies ----

void PendingCopies::add(int n) {
  std::lock_guard lk(mu_);
  n_ += n;
}
void PendingCopies::done(const Status& s) {
  std::lock_guard lk(mu_);
  if (!s.ok() && first_.ok()) first_ = s;
  if (--n_ == 0) cv_.notify_all();
}
Status PendingCopies::wait() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return n_ <= 0; });
  return first_;
}
void PendingCopies::reset() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return n_ <= 0; });
  first_ = Status();
}

// ---- into regions ----

namespace {

// Packs host pieces into the Uploader's slots (a piece may span slots, a slot
// may carry many pieces) and waits for every copy.
Status upload_pieces(Uploader& up, const Region& r, std::span<const HostPiece> pieces) {
  PendingCopies pending;
  std::optional<StagingSlot> slot;
  uint64_t used = 0;
  std::vector<UploadCopy> copies;
  auto flush_slot = [&]() -> Status {
    if (!slot) return Status();
    pending.add();
    Status s = up.submit(*slot, copies, [&pending](Status st) { pending.done(st); });
    slot.reset();
    copies.clear();
    used = 0;
    if (!s.ok()) pending.done(Status());
    return s;
  };
  Status st;
  for (const HostPiece& p : pieces) {
    uint64_t done = 0;
    while (st.ok() && done < p.size) {
      if (!slot) {
        auto a = up.acquire();
        if (!a.ok()) {
          st = a.status();
          break;
        }
        slot = *a;
      }
      uint64_t n = std::min<uint64_t>(slot->bytes.size() - used, p.size - done);
      std::memcpy(slot->bytes.data() + used, p.src + done, n);
      copies.push_back({used, r.data + p.dst_offset + done, n});
      used += n;
      done += n;
      if (used == slot->bytes.size()) st = flush_slot();
    }
    if (!st.ok()) break;
  }
  if (st.ok())
    st = flush_slot();
  else if (slot)
    up.release(*slot);
  Status w = pending.wait();
  return st.ok() ? w : st;
}

}  // namespace

Status write_region(Destination& dest, const Region& r, std::span<const HostPiece> pieces) {
  for (const HostPiece& p : pieces)
    if (p.dst_offset > r.size || p.size > r.size - p.dst_offset)
      return Status::Internal(
          fmt::format("write of {} bytes at {} exceeds the {}-byte region", p.size, p.dst_offset, r.size));
  if (r.device.host_accessible()) {
    for (const HostPiece& p : pieces)
      if (p.size > 0) std::memcpy(r.data + p.dst_offset, p.src, p.size);
    return Status();
  }
  return upload_pieces(*dest.uploader(), r, pieces);
}

Status write_region(Destination& dest, const Region& r, uint64_t offset, std::span<const std::byte> src) {
  if (src.empty() && offset <= r.size) return Status();
  HostPiece p{src.data(), offset, src.size()};
  return write_region(dest, r, std::span(&p, 1));
}

Status read_region(Destination& dest, const Region& r, uint64_t offset, const RandomAccessFile& file,
                   uint64_t file_offset, uint64_t n, PendingCopies& pending) {
  if (offset > r.size || n > r.size - offset)
    return Status::Internal(fmt::format("read of {} bytes at {} exceeds the {}-byte region", n, offset, r.size));
  if (n == 0) return Status();
  if (r.device.host_accessible()) return file.read_at(file_offset, std::span(r.data + offset, n));
  Uploader* up = dest.uploader();
  uint64_t done = 0;
  while (done < n) {
    WL_ASSIGN_OR_RETURN(StagingSlot slot, up->acquire());
    uint64_t len = std::min<uint64_t>(slot.bytes.size(), n - done);
    Status s = file.read_at(file_offset + done, slot.bytes.first(len));
    if (!s.ok()) {
      up->release(slot);
      return s;
    }
    UploadCopy c{0, r.data + offset + done, len};
    pending.add();
    s = up->submit(slot, std::span(&c, 1), [&pending](Status st) { pending.done(st); });
    if (!s.ok()) {
      pending.done(Status());
      return s;
    }
    done += len;
  }
  return Status();
}

}  // namespace wl

#include "gpu/ring.h"

#include <chrono>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "weightlift/switches.h"

namespace wl::gpu {

// ---- Ring ----------------------------------------------------------------------------

Result<std::unique_ptr<Ring>> Ring::create(const Api& api, const RingOptions& o) {
  WL_RETURN_IF_ERROR(require_device(api, 0));
  std::unique_ptr<Ring> r(new Ring(api, o.slot_bytes, o.slots));
  WL_RETURN_IF_ERROR(r->add_block(0));
  const uint32_t blocks = static_cast<uint32_t>(r->blocks_.size());
  if (blocks > 1 && !read_switches().ring_grow) {
    for (uint32_t b = 1; b < blocks; ++b) WL_RETURN_IF_ERROR(r->add_block(b));
  } else if (blocks > 1) {
    r->grower_ = std::thread([p = r.get(), blocks] {
      const auto t0 = std::chrono::steady_clock::now();
      for (uint32_t b = 1; b < blocks; ++b)
        if (!p->add_block(b).ok()) break;  // the ring stays smaller: loads still run
      add_cost(&ProcessCosts::ring_grow_ms, ms_since(t0));
      std::lock_guard lk(p->mu_);
      p->grown_ = true;
      p->cv_.notify_all();
    });
    return r;
  }
  std::lock_guard lk(r->mu_);
  r->grown_ = true;
  return r;
}

Ring::Ring(const Api& api, uint64_t slot_bytes, uint32_t slots)
    : api_(api), slot_bytes_(slot_bytes), slots_(slots), blocks_((slots + kBlock - 1) / kBlock, nullptr) {}

Status Ring::add_block(uint32_t b) {
  const uint32_t first = b * kBlock, n = std::min(kBlock, slots_ - first);
  void* p = nullptr;
  if (int rc = api_.rt.hostAlloc(&p, static_cast<size_t>(slot_bytes_ * n), kCudaHostAllocPortable); rc != 0)
    return cuda_error(
        api_, rc, fmt::format("cudaHostAlloc of {} slots of {} KiB of the pinned staging ring", n, slot_bytes_ >> 10));
  {
    std::lock_guard lk(mu_);
    blocks_[b] = static_cast<std::byte*>(p);
    // Under the free slots already there (those go first), lowest id on top.
    for (uint32_t i = first; i < first + n; ++i) free_.insert(free_.begin(), i);
    allocated_ += n;
  }
  cv_.notify_all();
  return Status();
}

Ring::~Ring() {
  if (grower_.joinable()) grower_.join();
  for (std::byte* p : blocks_)
    if (p) (void)api_.rt.freeHost(p);
}

uint32_t Ring::wait_grown() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return grown_; });
  return allocated_;
}

std::optional<uint32_t> Ring::acquire(const std::function<bool()>& stop) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop() || !free_.empty(); });
  if (stop()) return std::nullopt;
  uint32_t id = free_.back();
  free_.pop_back();
  return id;
}

void Ring::release(uint32_t id) {
  {
    std::lock_guard lk(mu_);
    free_.push_back(id);
  }
  cv_.notify_all();
}

void Ring::wake_all() {
  { std::lock_guard lk(mu_); }  // a waiter between its check and its wait sees the change
  cv_.notify_all();
}

uint32_t Ring::free_slots() const {
  std::lock_guard lk(mu_);
  return static_cast<uint32_t>(free_.size());
}

// ---- Copier ------------------------------------------------------------------------------

Result<std::unique_ptr<Copier>> Copier::create(const Api& api, int device, int streams, Ring* ring) {
  WL_RETURN_IF_ERROR(set_device(api, device));
  std::unique_ptr<Copier> c(new Copier(api, device, ring));
  for (int i = 0; i < streams; ++i) {
    void* s = nullptr;
    if (int rc = api.rt.streamCreateWithFlags(&s, kCudaStreamNonBlocking); rc != 0)
      return cuda_error(api, rc, fmt::format("cudaStreamCreateWithFlags on cuda:{}", device));
    c->streams_.push_back(s);
  }
  int ro = 0;
  c->host_register_ = api.rt.hostRegister && api.rt.deviceGetAttribute &&
                      api.rt.deviceGetAttribute(&ro, kCudaDevAttrHostRegisterReadOnlySupported, device) == 0 && ro == 1;
  // An event per slot (and a few spare) now, not during the first load.
  for (uint32_t i = 0; i < ring->slots() + 4; ++i) {
    void* e = nullptr;
    if (int rc = api.rt.eventCreateWithFlags(&e, kCudaEventDisableTiming); rc != 0)
      return cuda_error(api, rc, fmt::format("cudaEventCreateWithFlags on cuda:{}", device));
    c->all_events_.push_back(e);
    c->events_.push_back(e);
  }
  c->thread_ = std::thread([p = c.get()] { p->run(); });
  return c;
}

Copier::~Copier() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  (void)set_device(api_, device_);
  for (void* s : streams_) (void)api_.rt.streamDestroy(s);
  for (void* e : all_events_) (void)api_.rt.eventDestroy(e);
}

Result<void*> Copier::take_event() {
  std::lock_guard lk(events_mu_);
  if (!events_.empty()) {
    void* e = events_.back();
    events_.pop_back();
    return e;
  }
  void* e = nullptr;
  if (int rc = api_.rt.eventCreateWithFlags(&e, kCudaEventDisableTiming); rc != 0)
    return cuda_error(api_, rc, fmt::format("cudaEventCreateWithFlags on cuda:{}", device_));
  all_events_.push_back(e);
  return e;
}

Status Copier::submit(UploadTracker* owner, uint32_t slot, std::span<const UploadCopy> copies,
                      std::function<void(Status)> done) {
  std::span<std::byte> src = ring_->bytes(slot);
  for (const UploadCopy& c : copies)
    if (c.src_offset > src.size() || c.size > src.size() - c.src_offset) {
      ring_->release(slot);
      return Status::Internal(
          fmt::format("a copy of {} bytes at {} exceeds the {}-byte staging slot", c.size, c.src_offset, src.size()));
    }
  if (Status s = set_device(api_, device_); !s.ok()) {
    ring_->release(slot);
    return s;
  }
  void* stream = streams_[next_stream_++ % streams_.size()];
  Status copy_status;
  for (const UploadCopy& c : copies) {
    if (c.size == 0) continue;
    if (int rc = api_.rt.memcpyAsync(c.dst, src.data() + c.src_offset, static_cast<size_t>(c.size),
                                     kCudaMemcpyHostToDevice, stream);
        rc != 0) {
      copy_status = cuda_error(api_, rc, fmt::format("cudaMemcpyAsync of {} bytes to cuda:{}", c.size, device_));
      break;
    }
  }
  return finish_submit(owner, slot, stream, std::move(copy_status), std::move(done));
}

Status Copier::finish_submit(UploadTracker* owner, uint32_t slot, void* stream, Status copy_status,
                             std::function<void(Status)> done) {
  // The source may be read by copies already queued: a slot returns to the
  // ring (registered memory may be unregistered) only after an event behind
  // them, whatever happened.
  auto ev = take_event();
  if (ev.ok()) {
    if (int rc = api_.rt.eventRecord(*ev, stream); rc != 0) {
      std::lock_guard lk(events_mu_);
      events_.push_back(*ev);
      ev = cuda_error(api_, rc, "cudaEventRecord");
    }
  }
  if (!ev.ok()) {
    (void)api_.rt.streamSynchronize(stream);
    if (slot != kNoSlot) ring_->release(slot);
    return copy_status.ok() ? ev.status() : copy_status;
  }
  owner->add();
  {
    std::lock_guard lk(mu_);
    queue_.push_back({*ev, slot, owner, copy_status.ok() ? std::move(done) : std::function<void(Status)>()});
  }
  cv_.notify_all();
  return copy_status;
}

Status Copier::submit_host(UploadTracker* owner, std::span<const HostCopy> copies, std::function<void(Status)> done) {
  WL_RETURN_IF_ERROR(set_device(api_, device_));
  void* stream = streams_[next_stream_++ % streams_.size()];
  Status copy_status;
  for (const HostCopy& c : copies) {
    if (c.size == 0) continue;
    if (int rc = api_.rt.memcpyAsync(c.dst, c.src, static_cast<size_t>(c.size), kCudaMemcpyHostToDevice, stream);
        rc != 0) {
      copy_status = cuda_error(api_, rc, fmt::format("cudaMemcpyAsync of {} bytes to cuda:{}", c.size, device_));
      break;
    }
  }
  return finish_submit(owner, kNoSlot, stream, std::move(copy_status), std::move(done));
}

Status Copier::register_host(const std::byte* p, uint64_t n) {
  if (!host_register_)
    return Status::Unimplemented(fmt::format("cuda:{} cannot register host memory read-only", device_));
  const uint64_t len = (n + 4095) & ~uint64_t{4095};
  if (int rc = api_.rt.hostRegister(const_cast<std::byte*>(p), static_cast<size_t>(len),
                                    kCudaHostRegisterPortable | kCudaHostRegisterReadOnly);
      rc != 0) {
    (void)api_.rt.getLastError();  // not sticky, but clear it for the runtime's next caller
    return Status::Unimplemented(
        cuda_error(api_, rc, fmt::format("cudaHostRegister of {} bytes (read-only)", len)).message());
  }
  return Status();
}

void Copier::unregister_host(const std::byte* p) { (void)api_.rt.hostUnregister(const_cast<std::byte*>(p)); }

void Copier::run() {
  (void)set_device(api_, device_);
  while (true) {
    Submission s;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      s = std::move(queue_.front());
      queue_.pop_front();
    }
    int rc = api_.rt.eventSynchronize(s.event);
    Status st = rc == 0 ? Status() : cuda_error(api_, rc, fmt::format("copy to cuda:{}", device_));
    {
      std::lock_guard lk(events_mu_);
      events_.push_back(s.event);
    }
    if (s.slot != kNoSlot) ring_->release(s.slot);  // before `done`: readers go on while the sink runs
    const bool sink = static_cast<bool>(s.done);
    if (sink) s.done(st);
    // The sink's captures (a stream's mapped files, which unregister through
    // the uploader) go before the owner hears the copy is done: after that
    // the load may end and its destination free the uploader.
    s.done = nullptr;
    s.owner->done(sink ? st : Status());
  }
}

// ---- RingUploader --------------------------------------------------------------------------

Result<StagingSlot> RingUploader::acquire() {
  auto id = ring_->acquire([this] { return cancelled_.load(); });
  if (!id) return Status::Cancelled("the load was cancelled");
  return StagingSlot{ring_->bytes(*id), *id};
}

Status RingUploader::submit(StagingSlot slot, std::span<const UploadCopy> copies, std::function<void(Status)> done) {
  return copier_->submit(&tracker_, slot.id, copies, std::move(done));
}

void RingUploader::cancel() {
  cancelled_ = true;
  ring_->wake_all();
}

Result<std::unique_ptr<RingUploader>> ring_uploader(int device) {
  Backend& b = backend();
  WL_ASSIGN_OR_RETURN(Copier * c, b.copier(device));
  WL_ASSIGN_OR_RETURN(Ring * r, b.ring());
  return std::make_unique<RingUploader>(r, c);
}

}  // namespace wl::gpu

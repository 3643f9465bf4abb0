// Private: the pinned staging ring, the per-device copier and the Uploader
// over them (destination.h's contract).
//
//   Ring      N slots of pinned memory from one cudaHostAlloc, made once per
//             process (per backend) and reused by every load; a free list.
//   Copier    per device: S streams (copies go round-robin), a pool of
//             events, and one completion thread that waits for each
//             submission's event in submission order, returns its slot to
//             the ring, then runs its `done`.
//   RingUploader  one load's view of both: acquire() waits for a free slot
//             (or its own cancel()), submit() hands copies to the copier,
//             flush() waits for this load's submissions only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "gpu/api.h"
#include "weightlift/destination.h"

namespace wl::gpu {

class Ring {
 public:
  // The first kBlock slots (all of a smaller ring) are allocated now; the
  // rest, kBlock slots per cudaHostAlloc, on a thread of the ring's own, so
  // the first load starts on the first block while the others are pinned
  // (WEIGHTLIFT_RING_GROW=0: all of it now).
  static constexpr uint32_t kBlock = 8;
  static Result<std::unique_ptr<Ring>> create(const Api& api, const RingOptions& options);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  uint64_t slot_bytes() const { return slot_bytes_; }
  // Slots the ring has once grown (some may still be on their way).
  uint32_t slots() const { return slots_; }
  // A free slot, waiting while none is; nullopt once stop() is true (checked
  // whenever the ring changes and on wake_all()).
  std::optional<uint32_t> acquire(const std::function<bool()>& stop);
  void release(uint32_t id);
  void wake_all();
  std::span<std::byte> bytes(uint32_t id) const {
    return {blocks_[id / kBlock] + uint64_t{id % kBlock} * slot_bytes_, slot_bytes_};
  }
  uint32_t free_slots() const;
  // Waits until every block is allocated (or failed); the slots allocated.
  uint32_t wait_grown();

 private:
  Ring(const Api& api, uint64_t slot_bytes, uint32_t slots);
  Status add_block(uint32_t b);  // allocates block b and frees its slots
  const Api& api_;
  uint64_t slot_bytes_;
  uint32_t slots_;
  std::vector<std::byte*> blocks_;  // sized once; entry b set before its slots are freed
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint32_t> free_;
  uint32_t allocated_ = 0;
  bool grown_ = false;
  std::thread grower_;
};

// One load's submissions in flight and their first asynchronous error.
using UploadTracker = PendingCopies;

class Copier {
 public:
  static Result<std::unique_ptr<Copier>> create(const Api& api, int device, int streams, Ring* ring);
  ~Copier();
  Copier(const Copier&) = delete;
  Copier& operator=(const Copier&) = delete;

  int device() const { return device_; }
  // See Uploader::submit: the slot returns to the ring after the copies'
  // event, also when this fails (then `done` is not called).
  Status submit(UploadTracker* owner, uint32_t slot, std::span<const UploadCopy> copies,
                std::function<void(Status)> done);
  // Copies out of registered host memory (no slot); `done` as submit().
  Status submit_host(UploadTracker* owner, std::span<const HostCopy> copies, std::function<void(Status)> done);
  // cudaHostRegister(read-only) of [p, p+n) / its undoing; whether the device
  // supports read-only registration (its attribute, asked at creation).
  Status register_host(const std::byte* p, uint64_t n);
  void unregister_host(const std::byte* p);
  bool host_register_supported() const { return host_register_; }

 private:
  static constexpr uint32_t kNoSlot = ~0u;
  struct Submission {
    void* event = nullptr;
    uint32_t slot = 0;  // kNoSlot: copies out of registered host memory
    UploadTracker* owner = nullptr;
    std::function<void(Status)> done;  // empty: the submit failed
  };
  Copier(const Api& api, int device, Ring* ring) : api_(api), device_(device), ring_(ring) {}
  Result<void*> take_event();
  // Records an event behind `copy_status`'s copies on `stream` and queues the submission.
  Status finish_submit(UploadTracker* owner, uint32_t slot, void* stream, Status copy_status,
                       std::function<void(Status)> done);
  void run();

  const Api& api_;
  const int device_;
  Ring* ring_;
  std::vector<void*> streams_;
  bool host_register_ = false;
  std::atomic<uint64_t> next_stream_{0};
  std::mutex events_mu_;
  std::vector<void*> events_;      // free
  std::vector<void*> all_events_;  // to destroy
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Submission> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class RingUploader : public Uploader, public HostRegistration {
 public:
  RingUploader(Ring* ring, Copier* copier) : ring_(ring), copier_(copier) {}
  ~RingUploader() override { (void)flush(); }
  uint64_t slot_bytes() const override { return ring_->slot_bytes(); }
  uint32_t slot_count() const override { return ring_->slots(); }
  Result<StagingSlot> acquire() override;
  Status submit(StagingSlot slot, std::span<const UploadCopy> copies, std::function<void(Status)> done) override;
  void release(StagingSlot slot) override { ring_->release(slot.id); }
  Status flush() override { return tracker_.wait(); }
  void cancel() override;
  // Where the device can register host memory read-only (its attribute).
  HostRegistration* host_registration() override { return copier_->host_register_supported() ? this : nullptr; }
  Status register_host(const std::byte* p, uint64_t n) override { return copier_->register_host(p, n); }
  void unregister_host(const std::byte* p) override { copier_->unregister_host(p); }
  Status submit_host(std::span<const HostCopy> copies, std::function<void(Status)> done) override {
    return copier_->submit_host(&tracker_, copies, std::move(done));
  }
  // A new load: cancel() and earlier copy errors forgotten (after they completed).
  void reset() {
    tracker_.reset();
    cancelled_ = false;
  }
  int device() const { return copier_->device(); }

 private:
  Ring* ring_;
  Copier* copier_;
  UploadTracker tracker_;
  std::atomic<bool> cancelled_{false};
};

// An uploader for cuda:`device` on the current backend.
Result<std::unique_ptr<RingUploader>> ring_uploader(int device);

}  // namespace wl::gpu

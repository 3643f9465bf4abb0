#include "engine/delivery.h"

#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace wl::engine {

Delivery::Delivery(const LoadOptions& o, const std::function<Status(LoadedTensor&&)>& sink, const Plan& plan)
    : Delivery(o, sink,
               LoadProgress{.bytes_total = plan.bytes_total,
                            .tensors_total = plan.tensors.size(),
                            .files_total = plan.files.size()}) {}

Delivery::Delivery(const LoadOptions& o, const std::function<Status(LoadedTensor&&)>& sink, const LoadProgress& totals)
    : o_(o), sink_(sink) {
  p_.bytes_total = totals.bytes_total;
  p_.tensors_total = totals.tensors_total;
  p_.files_total = totals.files_total;
}

Status Delivery::deliver(const PlannedTensor& t, const std::string& file, TensorView view) {
  std::lock_guard lk(mu_);
  if (!status_.ok()) return status_;
  if (!o_.ordered) return emit_locked(t, file, std::move(view));
  if (t.ordinal != next_ordinal_) {
    held_.emplace(t.ordinal, Held{&t, file, std::move(view)});
    return Status();
  }
  WL_RETURN_IF_ERROR(emit_locked(t, file, std::move(view)));
  while (!held_.empty() && held_.begin()->first == next_ordinal_) {
    Held h = std::move(held_.begin()->second);
    held_.erase(held_.begin());
    WL_RETURN_IF_ERROR(emit_locked(*h.t, h.file, std::move(h.view)));
  }
  return Status();
}

Status Delivery::emit_locked(const PlannedTensor& t, const std::string& file, TensorView view) {
  next_ordinal_ = t.ordinal + 1;
  LoadedTensor lt;
  lt.name = t.name;
  lt.file = file;
  lt.view = std::move(view);
  lt.full_shape = t.full_shape;
  lt.ordinal = t.ordinal;
  Status s = sink_(std::move(lt));
  if (!s.ok()) {
    stop_locked(s);
    return s;
  }
  p_.bytes_done += t.nbytes;
  p_.tensors_done++;
  if (o_.progress && !o_.progress(p_)) {
    stop_locked(Status::Cancelled("load cancelled by the progress callback").with_file(file));
    return status_;
  }
  return Status();
}

void Delivery::stop_locked(Status s) {
  if (status_.ok()) status_ = std::move(s);
  held_.clear();
  if (!stop_.exchange(true) && on_stop_) on_stop_();
}

void Delivery::on_stop(std::function<void()> f) {
  std::lock_guard lk(mu_);
  on_stop_ = std::move(f);
  if (stop_.load() && on_stop_) on_stop_();
}

void Delivery::file_done() {
  std::lock_guard lk(mu_);
  p_.files_done++;
}

void Delivery::fail(Status s) {
  std::lock_guard lk(mu_);
  stop_locked(std::move(s));
}

Status Delivery::status() const {
  std::lock_guard lk(mu_);
  return status_;
}
uint64_t Delivery::tensors() const {
  std::lock_guard lk(mu_);
  return p_.tensors_done;
}
uint64_t Delivery::bytes() const {
  std::lock_guard lk(mu_);
  return p_.bytes_done;
}

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

TensorView view_of(const PlannedTensor& t, const Region& r) {
  return TensorView(t.dtype, t.shape, std::span<const std::byte>(r.data, r.size), r.owner, r.device);
}

Result<Region> place(const PlannedTensor& t, Destination& dest) {
  WL_ASSIGN_OR_RETURN(Region r, dest.allocate(t.request()), .tensor = t.name);
  if (r.size != t.nbytes)
    return Status::InvalidArgument(fmt::format("destination holds {} bytes, the tensor needs {}", r.size, t.nbytes))
        .with_tensor(t.name);
  if (r.data == nullptr && t.nbytes > 0)
    return Status::InvalidArgument("destination returned no memory").with_tensor(t.name);
  if (!r.device.host_accessible() && dest.uploader() == nullptr)
    return Status::InvalidArgument(fmt::format("destination memory on {} needs an uploader", r.device.to_string()))
        .with_tensor(t.name);
  return r;
}

namespace {

// Host bytes to put at dst_off inside a region.
struct HostPiece {
  const std::byte* src;
  uint64_t dst_off, len;
};

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
    while (st.ok() && done < p.len) {
      if (!slot) {
        auto a = up.acquire();
        if (!a.ok()) {
          st = a.status();
          break;
        }
        slot = *a;
      }
      uint64_t n = std::min<uint64_t>(slot->bytes.size() - used, p.len - done);
      std::memcpy(slot->bytes.data() + used, p.src + done, n);
      copies.push_back({used, r.data + p.dst_off + done, n});
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

Status write_region(Destination& dest, const Region& r, uint64_t offset, std::span<const std::byte> src) {
  if (offset > r.size || src.size() > r.size - offset)
    return Status::Internal(
        fmt::format("write of {} bytes at {} exceeds the {}-byte region", src.size(), offset, r.size));
  if (src.empty()) return Status();
  if (r.device.host_accessible()) {
    std::memcpy(r.data + offset, src.data(), src.size());
    return Status();
  }
  HostPiece p{src.data(), offset, src.size()};
  return upload_pieces(*dest.uploader(), r, std::span(&p, 1));
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

// Copies this rank's bytes of `full` (the whole tensor, host memory) into the region.
Status copy_shard(Destination& dest, const PlannedTensor& t, const Region& r, std::span<const std::byte> full) {
  if (!t.shard) {
    if (full.size() != r.size)
      return Status::Internal(fmt::format("tensor holds {} bytes, expected {}", full.size(), r.size));
    return write_region(dest, r, 0, full);
  }
  const ShardLayout& l = *t.shard;
  if (l.outer && l.first + (l.outer - 1) * l.stride + l.run > full.size())
    return Status::Internal("shard layout exceeds the tensor");
  if (l.outer * l.run != r.size)
    return Status::Internal(fmt::format("the shard holds {} bytes, the region {}", l.outer * l.run, r.size));
  if (r.device.host_accessible()) {
    for (uint64_t i = 0; i < l.outer; ++i) std::memcpy(r.data + i * l.run, full.data() + l.first + i * l.stride, l.run);
    return Status();
  }
  std::vector<HostPiece> pieces;
  pieces.reserve(static_cast<size_t>(l.outer));
  for (uint64_t i = 0; i < l.outer; ++i) pieces.push_back({full.data() + l.first + i * l.stride, i * l.run, l.run});
  return upload_pieces(*dest.uploader(), r, pieces);
}

Destination& default_destination() {
  static std::unique_ptr<Destination> d = host_destination();
  return *d;
}

}  // namespace wl::engine

#include "engine/delivery.h"

#include <cstring>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace wl::engine {

Delivery::Delivery(Progress progress, bool ordered, const std::function<Status(LoadedTensor&&)>& sink, const Plan& plan)
    : Delivery(std::move(progress), ordered, sink,
               LoadProgress{.bytes_total = plan.bytes_total,
                            .tensors_total = plan.tensors.size(),
                            .files_total = plan.files.size()}) {}

Delivery::Delivery(Progress progress, bool ordered, const std::function<Status(LoadedTensor&&)>& sink,
                   const LoadProgress& totals)
    : progress_(std::move(progress)), ordered_(ordered), sink_(sink) {
  p_.bytes_total = totals.bytes_total;
  p_.tensors_total = totals.tensors_total;
  p_.files_total = totals.files_total;
}

Status Delivery::deliver(const PlannedTensor& t, const std::string& file, TensorView view) {
  std::lock_guard lk(mu_);
  if (!status_.ok()) return status_;
  if (!ordered_) return emit_locked(t, file, std::move(view));
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
  if (progress_ && !progress_(p_)) {
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
  return write_region(dest, r, pieces);
}

Destination& default_destination() {
  static std::unique_ptr<Destination> d = host_destination();
  return *d;
}

}  // namespace wl::engine

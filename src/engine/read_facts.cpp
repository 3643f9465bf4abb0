// The facts of a planned load (PlanFacts), the request of a load's options,
// and decide(): what choose() is asked during plan_load().
#include "engine/read_facts.h"

#include <algorithm>

#include "weightlift/prefetch.h"

namespace wl {

ReadRequest read_request(const std::vector<std::string>& files, const LoadOptions& o) {
  ReadRequest r;
  r.files = files.size();
  if (!files.empty()) {
    r.first_file = files[0];
    if (is_url(files[0]))
      r.source = SourceKind::kRemote;
    else if (std::any_of(files.begin(), files.end(), [&](const std::string& f) { return o.env->arriving(f); }))
      r.source = SourceKind::kArriving;
  }
  if (Destination* d = o.destination) {
    r.device = d->device();
    r.dest = !r.device.host_accessible()              ? DestKind::kDevice
             : r.device.kind == DeviceKind::kCudaHost ? DestKind::kPinned
                                                      : DestKind::kCaller;
    if (Uploader* up = d->uploader())
      if (DirectReads* direct = up->direct_reads()) r.gds = direct->wish();
  }
  if (o.collective != nullptr) {
    r.distributed = true;
    r.world = o.collective->world_size();
    r.collective_device = o.collective->device();
  }
  r.strategy = o.strategy;
  r.direct = o.direct;
  r.file_views = o.file_views;
  r.populate_views = o.populate_views;
  r.max_memory = o.max_memory;
  r.threads = o.threads;
  r.block_size = o.block_size;
  r.device_as_asked = o.switches.device_strategy_asked;
  r.h2d_source = o.switches.h2d_source;
  return r;
}

namespace engine {

Result<std::optional<double>> PlanFacts::cached_fraction() {
  if (!plan_.files.empty() && is_url(plan_.files[0].path)) return std::optional<double>();
  return sample_residency(plan_.files.size(),
                          [&](size_t fi) { return open_data(plan_.files[fi], o_.env, FileMode::kPread); });
}

std::string PlanFacts::fs_type() { return files_.empty() ? std::string() : filesystem_type(files_[0], o_.system); }
Result<uint64_t> PlanFacts::checkpoint_bytes() { return checkpoint_size_bytes(files_, o_.env); }
Result<uint64_t> PlanFacts::available_memory() { return available_ram_bytes(o_.system); }

std::optional<bool> PlanFacts::contiguous() {
  for (const PlannedTensor& t : plan_.tensors)
    if (!t.file_offset) return false;
  return true;
}

Result<bool> PlanFacts::gds_usable(std::string* why) {
  Uploader* up = o_.destination ? o_.destination->uploader() : nullptr;
  DirectReads* direct = up ? up->direct_reads() : nullptr;
  if (direct == nullptr || plan_.files.empty()) {
    *why = up ? "this uploader has no direct reads" : "no uploader";
    return false;
  }
  WL_ASSIGN_OR_RETURN(auto probe, open_data(plan_.files[0], o_.env, FileMode::kDirect));
  Status s = direct->support(*probe);
  if (!s.ok()) *why = s.message();
  return s.ok();
}

std::optional<UploaderFacts> PlanFacts::uploader() {
  UploaderFacts f;
  Uploader* up = o_.destination ? o_.destination->uploader() : nullptr;
  if (up == nullptr) return f;
  f.present = true;
  f.ready = up->ready();
  if (!f.ready.ok()) return f;
  f.slot_bytes = up->slot_bytes();
  f.slot_count = up->slot_count();
  f.host_registration = up->host_registration() != nullptr;
  return f;
}

uint64_t PlanFacts::stream_bytes() {
  uint64_t n = 0;
  for (const PlannedTensor& t : plan_.tensors)
    if (t.file_offset) n += t.nbytes;
  return n;
}

Result<ReadPath> decide(const std::vector<std::string>& files, const LoadOptions& o, const Plan& plan,
                        bool read_ahead) {
  PlanFacts measured(plan, files, o);
  GivenFacts facts(&measured);
  facts.fstype = o.known.fs_type;
  facts.bytes = o.known.checkpoint_bytes;
  facts.available = o.known.available_bytes;
  facts.cached = o.known.cached_fraction;
  ReadRequest r = read_request(files, o);
  r.read_ahead = read_ahead;
  return choose(r, facts);
}

}  // namespace engine

}  // namespace wl

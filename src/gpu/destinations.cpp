// weightlift/gpu.h: devices, ring options, the pinned and CUDA destinations,
// copies back to the host, device buffers.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "gpu/api.h"
#include "gpu/gds.h"
#include "gpu/ring.h"
#include "weightlift/switches.h"
#include "weightlift/synth.h"

namespace wl::gpu {

// ---- devices -------------------------------------------------------------------

int device_count() { return backend().api().devices; }

std::string unavailable_reason() {
  const Api& a = backend().api();
  return a.devices > 0 ? std::string() : a.reason;
}

std::string backend_name() { return backend().api().name; }

Status check_device(Device d) {
  if (d.kind == DeviceKind::kCpu) return Status();
  const Api& a = backend().api();
  return require_device(a, d.kind == DeviceKind::kCuda ? d.index : 0);
}

Result<MemoryInfo> memory_info(int device) {
  const Api& a = backend().api();
  WL_RETURN_IF_ERROR(set_device(a, device));
  size_t f = 0, t = 0;
  if (int rc = a.rt.memGetInfo(&f, &t); rc != 0) return cuda_error(a, rc, "cudaMemGetInfo");
  return MemoryInfo{f, t};
}

// ---- ring options -----------------------------------------------------------------

namespace {

std::mutex g_ring_mu;
std::optional<RingOptions> g_ring_set;

Status check_ring(const RingOptions& o, std::string_view where) {
  if (o.slots < 2 || o.slots > 64)
    return Status::InvalidArgument(fmt::format("{}: {} slots is outside 2..64", where, o.slots));
  if (o.slot_bytes < (uint64_t{64} << 10) || o.slot_bytes > (uint64_t{256} << 20) || o.slot_bytes % 4096 != 0)
    return Status::InvalidArgument(fmt::format(
        "{}: a slot of {} bytes is outside 64 KiB..256 MiB or not a multiple of 4096", where, o.slot_bytes));
  if (o.streams < 1 || o.streams > 8)
    return Status::InvalidArgument(fmt::format("{}: {} copy streams is outside 1..8", where, o.streams));
  return Status();
}

}  // namespace

RingOptions machine_ring_options(unsigned cores, uint64_t memory_bytes) {
  RingOptions o;
  o.slots = std::clamp<uint32_t>(2 * std::max(cores, 1u), 8, 64);
  // At most 1/64 of the memory (but never under 8 slots of 1 MiB).
  while (memory_bytes > 0 && o.slots * o.slot_bytes > memory_bytes / 64) {
    if (o.slots > 8)
      o.slots -= 8;
    else if (o.slot_bytes > (uint64_t{1} << 20))
      o.slot_bytes /= 2;
    else
      break;
  }
  return o;
}

Result<RingOptions> ring_options() {
  std::lock_guard lk(g_ring_mu);
  if (g_ring_set) return *g_ring_set;
  const std::string env = read_switches().pinned_ring;
  if (env.empty()) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return machine_ring_options(std::thread::hardware_concurrency(),
                                pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0);
  }
  RingOptions o;
  std::string_view v(env);
  auto x = v.find('x');
  const std::string where = fmt::format("{}='{}' (expected SLOTSxSIZE[xSTREAMS], e.g. 8x8MiB)", kRingEnv, v);
  if (x == std::string_view::npos || x == 0) return Status::InvalidArgument(where);
  uint32_t slots = 0;
  for (char c : v.substr(0, x)) {
    if (c < '0' || c > '9' || slots > 1000) return Status::InvalidArgument(where);
    slots = slots * 10 + static_cast<uint32_t>(c - '0');
  }
  std::string_view size_text = v.substr(x + 1);
  if (auto y = size_text.rfind('x'); y != std::string_view::npos) {
    std::string_view streams = size_text.substr(y + 1);
    if (streams.empty() || streams.size() > 2) return Status::InvalidArgument(where);
    int n = 0;
    for (char c : streams) {
      if (c < '0' || c > '9') return Status::InvalidArgument(where);
      n = n * 10 + (c - '0');
    }
    o.streams = n;
    size_text = size_text.substr(0, y);
  }
  auto size = parse_size(size_text);
  if (!size.ok()) return Status::InvalidArgument(where);
  o.slots = slots;
  o.slot_bytes = *size;
  WL_RETURN_IF_ERROR(check_ring(o, where));
  return o;
}

Status set_ring_options(const RingOptions& o) {
  WL_RETURN_IF_ERROR(check_ring(o, "ring options"));
  if (backend().ring_created())
    return Status::InvalidArgument("the pinned staging ring already exists (set its options before the first load)");
  std::lock_guard lk(g_ring_mu);
  g_ring_set = o;
  return Status();
}

void reset_ring_options() {
  std::lock_guard lk(g_ring_mu);
  g_ring_set.reset();
}

// ---- memory owners ----------------------------------------------------------------------

namespace {

// One allocation of device or pinned memory; freed with the last view.
struct Memory {
  const Api* api = nullptr;
  bool pinned = false;
  int device = 0;
  std::byte* ptr = nullptr;
  uint64_t size = 0;
  ~Memory() {
    if (!ptr) return;
    if (pinned) {
      (void)api->rt.freeHost(ptr);
    } else {
      (void)api->rt.setDevice(device);
      (void)api->rt.free(ptr);
    }
  }
};

Result<std::shared_ptr<Memory>> allocate_memory(const Api& api, bool pinned, int device, uint64_t n) {
  auto m = std::make_shared<Memory>();
  m->api = &api;
  m->pinned = pinned;
  m->device = device;
  m->size = n;
  void* p = nullptr;
  if (pinned) {
    WL_RETURN_IF_ERROR(require_device(api, 0));
    if (int rc = api.rt.hostAlloc(&p, static_cast<size_t>(std::max<uint64_t>(n, 1)), kCudaHostAllocPortable); rc != 0)
      return cuda_error(api, rc, fmt::format("cudaHostAlloc of {} bytes of pinned memory", n));
  } else {
    WL_RETURN_IF_ERROR(set_device(api, device));
    if (int rc = api.rt.malloc(&p, static_cast<size_t>(std::max<uint64_t>(n, 1))); rc != 0) {
      size_t f = 0, t = 0;
      std::string free_note;
      if (api.rt.memGetInfo(&f, &t) == 0) free_note = fmt::format(" ({} MiB of {} MiB free)", f >> 20, t >> 20);
      return cuda_error(api, rc, fmt::format("cudaMalloc of {} bytes on cuda:{}{}", n, device, free_note));
    }
  }
  m->ptr = static_cast<std::byte*>(p);
  return m;
}

constexpr uint64_t kTensorAlign = 256;  // cudaMalloc's own alignment

// What reserve() laid out: one allocation, a slot per ordinal.
struct Arena {
  std::shared_ptr<Memory> memory;
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> at;  // ordinal -> (offset, size)
};

Result<std::shared_ptr<Arena>> make_arena(const Api& api, bool pinned, int device,
                                          std::span<const TensorRequest> tensors) {
  auto a = std::make_shared<Arena>();
  uint64_t total = 0;
  for (const TensorRequest& t : tensors) {
    if (t.nbytes > (uint64_t{1} << 50) || total > (uint64_t{1} << 50))
      return Status::InvalidArgument(fmt::format("{} bytes do not fit one allocation", t.nbytes)).with_tensor(t.name);
    a->at[t.ordinal] = {total, t.nbytes};
    total += (t.nbytes + kTensorAlign - 1) & ~(kTensorAlign - 1);
  }
  if (total == 0) return std::shared_ptr<Arena>();
  WL_ASSIGN_OR_RETURN(a->memory, allocate_memory(api, pinned, device, total));
  return a;
}

// Pinned or device memory: one arena per load after reserve(), else one
// allocation per tensor.
class ArenaDestination : public DeviceDestination {
 public:
  ArenaDestination(Backend& b, Device device, bool one_allocation)
      : backend_(b), device_(device), one_(one_allocation) {}
  Device device() const override { return device_; }
  Status reserve(std::span<const TensorRequest> tensors) override {
    std::shared_ptr<Arena> a;
    if (one_) {
      const auto t0 = std::chrono::steady_clock::now();
      WL_ASSIGN_OR_RETURN(a, make_arena(backend_.api(), pinned(), device_.index, tensors));
      if (a && !pinned()) set_cost_once(&ProcessCosts::first_allocation_ms, ms_since(t0));
    }
    std::lock_guard lk(mu_);
    arena_ = std::move(a);
    if (arena_) allocated_ += arena_->memory->size;
    return Status();
  }
  Result<Region> allocate(const TensorRequest& req) override {
    {
      std::lock_guard lk(mu_);
      if (arena_) {
        auto it = arena_->at.find(req.ordinal);
        if (it != arena_->at.end() && it->second.second == req.nbytes)
          return Region{arena_->memory->ptr + it->second.first, req.nbytes, device_, arena_};
      }
    }
    WL_ASSIGN_OR_RETURN(auto m, allocate_memory(backend_.api(), pinned(), device_.index, req.nbytes));
    allocated_ += req.nbytes;
    return Region{m->ptr, req.nbytes, device_, m};
  }
  uint64_t allocated_bytes() const override { return allocated_.load(); }
  std::string gds_status() const override { return {}; }

 protected:
  bool pinned() const { return device_.kind == DeviceKind::kCudaHost; }
  // The current arena's memory (null without one).
  std::pair<const std::byte*, uint64_t> arena_memory() {
    std::lock_guard lk(mu_);
    if (!arena_) return {nullptr, 0};
    return {arena_->memory->ptr, arena_->memory->size};
  }
  Backend& backend_;
  const Device device_;
  const bool one_;
  std::mutex mu_;
  std::shared_ptr<Arena> arena_;
  std::atomic<uint64_t> allocated_{0};
};

class CudaDestination;

// The ring uploader (and its host registration) plus GPUDirect Storage for
// this destination's memory. The ring is taken on first use (a load's plan
// asks for it), not when the destination is made, so that warm_up() can
// still be creating it meanwhile.
class CudaUploader final : public Uploader, public DirectReads {
 public:
  CudaUploader(CudaDestination* dest, Toggle policy, Backend& b, int device)
      : dest_(dest), policy_(policy), trust_cufile_(read_switches().gds_auto_trusts_cufile), device_(device),
        direct_(b, device) {}
  Status ready() override { return ring() ? Status() : ring_status_; }
  uint64_t slot_bytes() const override { return ring() ? ring_->slot_bytes() : 0; }
  Result<StagingSlot> acquire() override {
    if (!ring()) return ring_status_;
    return ring_->acquire();
  }
  Status submit(StagingSlot slot, std::span<const UploadCopy> copies, std::function<void(Status)> done) override {
    if (!ring()) return ring_status_;
    return ring_->submit(slot, copies, std::move(done));
  }
  void release(StagingSlot slot) override {
    if (ring()) ring_->release(slot);
  }
  Status flush() override { return made_.load() ? ring_->flush() : Status(); }
  void cancel() override {
    if (made_.load()) ring_->cancel();
  }
  uint32_t slot_count() const override { return ring() ? ring_->slot_count() : 0; }
  HostRegistration* host_registration() override { return ring() ? ring_->host_registration() : nullptr; }
  DirectReads* direct_reads() override { return this; }
  Toggle wish() const override { return policy_; }
  // The platform's verdict (cached per device and filesystem) before cuFile
  // for auto; cuFile alone for on, or for auto with WEIGHTLIFT_GDS_AUTO=cufile
  // as the destination was made (gds.h).
  Status support(const RandomAccessFile& probe) override { return direct_.support(probe, policy_, trust_cufile_); }
  void chosen(bool on, const std::string& why) override;
  Status read(const RandomAccessFile& file, uint64_t offset, std::byte* dst, uint64_t n) override {
    return direct_.read(file, offset, dst, n);
  }
  // A new load: the ring (made, or waited for, now), cancel() and errors forgotten.
  Status new_load() {
    if (!ring()) return ring_status_;
    ring_->reset();
    return Status();
  }
  std::string status() const {
    std::lock_guard lk(mu_);
    return status_;
  }

 private:
  // The ring and this device's copier, taken on first use (not when the
  // destination is made: warm_up() may still be making them).
  RingUploader* ring() const {
    std::call_once(ring_once_, [&] {
      auto r = ring_uploader(device_);
      if (r.ok()) {
        ring_ = std::move(*r);
        made_ = true;
      } else {
        ring_status_ = r.status();
      }
    });
    return ring_.get();
  }
  mutable std::once_flag ring_once_;
  mutable std::unique_ptr<RingUploader> ring_;
  mutable Status ring_status_;
  mutable std::atomic<bool> made_{false};
  CudaDestination* dest_;
  const Toggle policy_;
  const bool trust_cufile_;
  const int device_;
  DirectReader direct_;
  mutable std::mutex mu_;
  std::string status_;
};

class CudaDestination final : public ArenaDestination {
 public:
  CudaDestination(Backend& b, Device d, const CudaOptions& o)
      : ArenaDestination(b, d, o.one_allocation), uploader_(std::make_unique<CudaUploader>(this, o.gds, b, d.index)) {}
  ~CudaDestination() override { (void)uploader_->flush(); }
  Status reserve(std::span<const TensorRequest> tensors) override {
    WL_RETURN_IF_ERROR(uploader_->new_load());
    return ArenaDestination::reserve(tensors);
  }
  Uploader* uploader() override { return uploader_.get(); }
  std::string gds_status() const override { return uploader_->status(); }
  using ArenaDestination::arena_memory;

 private:
  std::unique_ptr<CudaUploader> uploader_;
};

void CudaUploader::chosen(bool on, const std::string& why) {
  std::lock_guard lk(mu_);
  if (on) {
    auto [base, n] = dest_->arena_memory();
    if (base) direct_.register_buffer(base, n);
    status_ = "on";
  } else {
    status_ = fmt::format("off ({})", why);
  }
}

}  // namespace

// ---- factories ---------------------------------------------------------------------------

Result<std::unique_ptr<DeviceDestination>> pinned_destination() {
  Backend& b = backend();
  WL_RETURN_IF_ERROR(require_device(b.api(), 0));
  return std::unique_ptr<DeviceDestination>(
      std::make_unique<ArenaDestination>(b, Device{DeviceKind::kCudaHost, 0}, true));
}

Result<std::unique_ptr<DeviceDestination>> cuda_destination(Device device, const CudaOptions& options) {
  if (device.kind != DeviceKind::kCuda)
    return Status::InvalidArgument(fmt::format("cuda_destination() needs a CUDA device, not {}", device.to_string()));
  Backend& b = backend();
  WL_RETURN_IF_ERROR(require_device(b.api(), device.index));
  return std::unique_ptr<DeviceDestination>(std::make_unique<CudaDestination>(b, device, options));
}

Result<std::unique_ptr<Uploader>> make_uploader(Device device) {
  if (device.kind != DeviceKind::kCuda)
    return Status::InvalidArgument(fmt::format("an uploader copies to a CUDA device, not {}", device.to_string()));
  WL_ASSIGN_OR_RETURN(auto u, ring_uploader(device.index));
  return std::unique_ptr<Uploader>(std::move(u));
}

Result<std::unique_ptr<DeviceDestination>> destination_for(Device device, const CudaOptions& options) {
  if (device.kind == DeviceKind::kCpu) return std::unique_ptr<DeviceDestination>();
  WL_RETURN_IF_ERROR(check_device(device));
  if (device.kind == DeviceKind::kCuda) return cuda_destination(device, options);
  return pinned_destination();
}

namespace {

// The caller's memory on a device, with the uploader it owns.
class CallerDeviceDestination final : public Destination {
 public:
  CallerDeviceDestination(RegionFn fn, Device device, std::unique_ptr<Uploader> up)
      : up_(std::move(up)), inner_(caller_destination(std::move(fn), device, up_.get())) {}
  Device device() const override { return inner_->device(); }
  Result<Region> allocate(const TensorRequest& r) override { return inner_->allocate(r); }
  Uploader* uploader() override { return up_.get(); }

 private:
  std::unique_ptr<Uploader> up_;
  std::unique_ptr<Destination> inner_;
};

}  // namespace

Result<std::unique_ptr<Destination>> caller_destination_for(RegionFn fn, Device device) {
  if (device.kind != DeviceKind::kCuda) return caller_destination(std::move(fn), device);
  WL_ASSIGN_OR_RETURN(auto up, make_uploader(device));
  return std::unique_ptr<Destination>(std::make_unique<CallerDeviceDestination>(std::move(fn), device, std::move(up)));
}

// ---- copies ---------------------------------------------------------------------------------

Status copy_to_host(const TensorView& v, std::span<std::byte> dst) {
  if (dst.size() != v.nbytes())
    return Status::InvalidArgument(fmt::format("{} bytes cannot hold a {}-byte tensor", dst.size(), v.nbytes()));
  if (v.nbytes() == 0) return Status();
  if (v.device().host_accessible()) {
    std::memcpy(dst.data(), v.data(), v.nbytes());
    return Status();
  }
  const Api& a = backend().api();
  WL_RETURN_IF_ERROR(set_device(a, v.device().index));
  if (int rc = a.rt.memcpy(dst.data(), v.data(), v.nbytes(), kCudaMemcpyDeviceToHost); rc != 0)
    return cuda_error(a, rc, fmt::format("cudaMemcpy of {} bytes from {}", v.nbytes(), v.device().to_string()));
  return Status();
}

Result<TensorView> read_to_device(const RandomAccessFile& file, uint64_t offset, DType dtype, Shape shape,
                                  Device device) {
  auto need = dtype_nbytes(dtype, shape_numel(shape));
  if (!need) return Status::InvalidArgument("the tensor's size overflows").with_file(file.path());
  const uint64_t n = *need;
  if (device.kind == DeviceKind::kCpu) {
    WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(dtype, shape));
    WL_RETURN_IF_ERROR(file.read_at(offset, t.mutable_bytes()));
    return t.view();
  }
  Backend& b = backend();
  WL_ASSIGN_OR_RETURN(auto m, allocate_memory(b.api(), device.kind == DeviceKind::kCudaHost, device.index, n));
  Region r{m->ptr, n, device, m};
  if (device.kind == DeviceKind::kCudaHost) {
    WL_RETURN_IF_ERROR(file.read_at(offset, std::span(r.data, n)));
  } else {
    WL_ASSIGN_OR_RETURN(auto up, ring_uploader(device.index));
    auto dest = caller_destination([&](const TensorRequest&) -> Result<Region> { return r; }, device, up.get());
    PendingCopies pending;
    Status s = read_region(*dest, r, 0, file, offset, n, pending);
    Status w = pending.wait();
    WL_RETURN_IF_ERROR(s);
    WL_RETURN_IF_ERROR(w);
  }
  return TensorView(dtype, std::move(shape), std::span<const std::byte>(r.data, n), m, device);
}

// ---- DeviceBuffer ------------------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, int device) {
  const Api& a = backend().api();
  WL_RETURN_IF_ERROR(set_device(a, device));
  DeviceBuffer out;
  if (int rc = a.rt.malloc(&out.ptr_, std::max<size_t>(bytes, 1)); rc != 0)
    return cuda_error(a, rc, fmt::format("cudaMalloc of {} bytes on cuda:{}", bytes, device));
  out.size_ = bytes;
  out.device_ = device;
  return out;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)), device_(o.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
    device_ = o.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

void DeviceBuffer::reset() {
  if (ptr_) {
    const Api& a = backend().api();
    (void)a.rt.setDevice(device_);
    (void)a.rt.free(ptr_);
  }
  ptr_ = nullptr;
  size_ = 0;
}

Status DeviceBuffer::copy_to_host(std::span<std::byte> dst) const {
  if (dst.size() != size_) return Status::InvalidArgument("host and device buffer sizes differ");
  const Api& a = backend().api();
  WL_RETURN_IF_ERROR(set_device(a, device_));
  if (int rc = a.rt.memcpy(dst.data(), ptr_, size_, kCudaMemcpyDeviceToHost); rc != 0)
    return cuda_error(a, rc, "cudaMemcpy to host");
  return Status();
}

Status DeviceBuffer::copy_from_host(std::span<const std::byte> src) {
  if (src.size() != size_) return Status::InvalidArgument("host and device buffer sizes differ");
  const Api& a = backend().api();
  WL_RETURN_IF_ERROR(set_device(a, device_));
  if (int rc = a.rt.memcpy(ptr_, src.data(), size_, kCudaMemcpyHostToDevice); rc != 0)
    return cuda_error(a, rc, "cudaMemcpy to device");
  return Status();
}

}  // namespace wl::gpu

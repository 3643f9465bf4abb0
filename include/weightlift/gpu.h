// weightlift/gpu.h: CUDA devices, the pinned staging ring, and the pinned and
// CUDA destinations (destination.h) that put a load's tensors in page-locked
// host memory or straight into device memory.
//
// Run-time linkage. Every CUDA runtime/driver, cuFile and NCCL entry point
// weightlift uses sits in one function table filled on first use with
// dlopen(), so one build runs with and without a GPU:
//   driver   libcuda.so.1 (absent: "no NVIDIA driver")
//   runtime  a libcudart the process already has loaded (torch's), else
//            $WEIGHTLIFT_CUDART, else the runtime linked into
//            libweightlift_cuda.so (our kernels, found like before: next to
//            the binary or library, ../lib, $WEIGHTLIFT_CUDA_LIBRARY), else
//            libcudart.so.13/.12 by name
//   cuFile   libcufile.so.0, opened only when a device was found and a load
//            asks for GPUDirect Storage (its driver open does not return on a
//            machine without a GPU)
//   NCCL     libnccl.so.2, for the distributed component (collective.h)
// WEIGHTLIFT_GPU_BACKEND=fake swaps the whole table for a host fake backend
// (host memory standing for device memory, threads for streams; see
// docs/gpu.md), which is how CPU-only CI runs the device path;
// WEIGHTLIFT_FAKE_GPUS=N sets its device count (default 1).
//
// The device path (destination.h): the engine reads into slots of a small
// pinned ring, allocated once per process and reused (never sized by the
// largest tensor), and copies each slot to the device with cudaMemcpyAsync
// on two streams; an event per slot returns it to the ring once its copies
// have completed, and a tensor is handed over when its last copy has. Peak
// host memory of a device load is the ring plus the engine's bookkeeping.
// GPUDirect Storage (CudaOptions::gds): cuFile reads straight from the file
// into device memory. With Toggle::kAuto it is used where the platform reads
// the first file's filesystem GPU-direct (checked before cuFile is opened,
// then cuFile's driver properties; the verdict cached per device and
// filesystem) and cuFile registers the file; kOn asks cuFile alone. The
// decision (choose(), read_path.h, asking the destination's uploader), and
// the fallback to the ring, is made before the first tensor is handed over,
// and holds for the whole load.
//
// Threading: everything here is thread-safe. Device memory is freed when the
// last TensorView sharing it is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "weightlift/destination.h"
#include "weightlift/device.h"
#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {
struct DummyOptions;  // dummy.h
}  // namespace wl

namespace wl::gpu {

// ---- devices ----------------------------------------------------------------

// Usable CUDA devices; 0 without a driver, a device or the runtime library.
int device_count();
// Why there is no usable device, naming what is missing (the NVIDIA driver,
// a device, the CUDA runtime library); "" when device_count() > 0.
std::string unavailable_reason();
// "cuda (runtime: <library>)", "fake (host memory)" or "none".
std::string backend_name();
// OK when `device` can be used: host memory always; pinned memory and
// cuda:N need a device (kUnavailable with unavailable_reason()); a CUDA
// ordinal past the last device is kInvalidArgument.
Status check_device(Device device);

struct MemoryInfo {
  uint64_t free_bytes = 0, total_bytes = 0;
};
Result<MemoryInfo> memory_info(int device);

// ---- what a process pays once ----------------------------------------------------

// The one-time work behind the first device load of a process, in
// milliseconds (0: not done, or not needed). Reported by `load --verbose`,
// Python's gpu_process_costs() and bench/gpu.
struct ProcessCosts {
  double detect_ms = 0;     // the function table: libcuda and cuInit, the runtime (/proc/self/maps, dlopen)
  double kernels_ms = 0;    // dlopen of libweightlift_cuda.so (dummy weights, or the runtime it carries)
  double context_ms = 0;    // the devices' primary contexts (none here when torch made them first)
  double ring_ms = 0;       // cudaHostAlloc of the ring's first 8 slots (pages resident: no first touch)
  double ring_grow_ms = 0;  // the rest of the ring, pinned on a thread of its own while loads run
  uint64_t ring_bytes = 0;
  double copier_ms = 0;            // copy streams, their events and the completion thread
  double gds_probe_ms = 0;         // GPUDirect Storage's platform checks (/proc, /sys), per filesystem
  double cufile_ms = 0;            // dlopen of libcufile and cuFileDriverOpen: only where GDS can work
  double first_allocation_ms = 0;  // the first load's device allocation (cudaMalloc of its arena)
  bool warm_up = false;            // detection, context, ring and copier ran on warm_up()'s thread
  // "detect 3.1 ms, context 210.0 ms, ring 256 MiB 18.2 ms, ..." (parts not paid are left out).
  std::string to_string() const;
};
ProcessCosts process_costs();

// Starts, on a background thread, what the first load to `device` would pay
// (detection, its context, the ring, its copier), so that it overlaps the
// caller's own start-up (argument parsing, planning, Python); returns at
// once. The first call per process does it, later ones nothing; a load
// that needs the ring meanwhile waits for it. No-op for the CPU, without a
// device, or with WEIGHTLIFT_GPU_WARMUP=0.
void warm_up(Device device);
// Waits for warm_up()'s thread (tests).
void wait_warm_up();

// ---- the staging ring ---------------------------------------------------------

struct RingOptions {
  uint32_t slots = 8;                       // 2..64
  uint64_t slot_bytes = uint64_t{8} << 20;  // 64 KiB..256 MiB, a multiple of 4096
  int streams = 2;                          // copy streams per device, 1..8
};
// "SLOTSxSIZE[xSTREAMS]", e.g. "8x8MiB" or "32x8MiBx2": read when the ring is created.
inline constexpr const char* kRingEnv = "WEIGHTLIFT_PINNED_RING";
// The ring this machine gets by default: 8 MiB slots, two per core up to 64
// (at least 8), at most 1/64 of the physical memory; 2 streams.
RingOptions machine_ring_options(unsigned cores, uint64_t memory_bytes);
// The options the ring has (or will be created with): set_ring_options(),
// else $WEIGHTLIFT_PINNED_RING, else machine_ring_options() of this machine.
// A bad variable is kInvalidArgument naming it.
Result<RingOptions> ring_options();
// Sets the options before the ring exists; kInvalidArgument for values out of
// range or once the ring has been created.
Status set_ring_options(const RingOptions& options);

// ---- destinations ---------------------------------------------------------------

struct CudaOptions {
  // kOn: a load fails (before its first tensor) when GPUDirect Storage
  // cannot be used; kAuto falls back to the ring; kOff never tries it.
  Toggle gds = Toggle::kAuto;
  // true: Destination::reserve() takes one device allocation for the whole
  // load and every tensor is a view sharing it (freed with the last view);
  // false, or tensors the reservation did not cover: one allocation each.
  bool one_allocation = true;
};

// A pinned or CUDA destination: what it allocated and how it read.
// One destination serves one load at a time.
class DeviceDestination : public Destination {
 public:
  // Bytes of device (or pinned) memory this destination has allocated.
  virtual uint64_t allocated_bytes() const = 0;
  // "" before a load decided; "on" when GPUDirect Storage served the load;
  // "off (<why>)" otherwise.
  virtual std::string gds_status() const = 0;
};

// Page-locked host memory (cudaHostAlloc): host-accessible, so the engine
// reads straight into it; one allocation per load after reserve().
Result<std::unique_ptr<DeviceDestination>> pinned_destination();
// Device memory of `device` (kCuda), filled through the ring or cuFile.
Result<std::unique_ptr<DeviceDestination>> cuda_destination(Device device, const CudaOptions& options = {});
// The copy engine alone, for caller_destination() with device memory the
// caller holds (vLLM's parameters). Serves one load.
Result<std::unique_ptr<Uploader>> make_uploader(Device device);

// The one device -> destination factory (the CLI's --device, the Python
// options' "device"): nullptr for the CPU (host memory of the engine's
// choosing), pinned memory, or cuda:N with `options`. kUnavailable or
// kInvalidArgument naming what is missing when the device cannot be used.
Result<std::unique_ptr<DeviceDestination>> destination_for(Device device, const CudaOptions& options = {});
// The caller's own memory on `device` (host, pinned, or cuda:N filled
// through the engine's pinned ring, made now): `fn` returns each tensor's region.
Result<std::unique_ptr<Destination>> caller_destination_for(RegionFn fn, Device device);

// ---- copies ---------------------------------------------------------------------

// The view's bytes into host memory (dst.size() == view.nbytes()): a device
// copy for kCuda views, memcpy otherwise.
Status copy_to_host(const TensorView& view, std::span<std::byte> dst);
// n bytes of `file` at `offset` as a tensor on `device` (staged through the
// ring for kCuda; read straight into pinned or host memory otherwise).
Result<TensorView> read_to_device(const RandomAccessFile& file, uint64_t offset, DType dtype, Shape shape,
                                  Device device);

// ---- device buffers and dummy weights ---------------------------------------------

// Device memory; freed by the destructor. Move-only; one thread at a time.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(size_t bytes, int device = 0);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  size_t size() const { return size_; }
  int device() const { return device_; }
  // Whole-buffer copies; sizes must match.
  Status copy_to_host(std::span<std::byte> dst) const;
  Status copy_from_host(std::span<const std::byte> src);

 private:
  void reset();
  void* ptr_ = nullptr;
  size_t size_ = 0;
  int device_ = 0;
};

// fill_dummy() (dummy.h) for device memory: the same bytes as the CPU fill
// (libweightlift_cuda.so's kernel; the fake backend fills on the host).
Status fill_dummy_device(DType dtype, void* device_ptr, uint64_t numel, const DummyOptions& options, int device = 0);
Status fill_dummy_device(DType dtype, void* device_ptr, uint64_t numel);  // default options, device 0
// Into a DeviceBuffer, checked to hold numel elements.
Status fill_dummy_device(DType dtype, DeviceBuffer& buffer, uint64_t numel, const DummyOptions& options);

}  // namespace wl::gpu

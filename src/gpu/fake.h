// Private: the host fake GPU backend. It fills the same function table as the
// real libraries (api.h), so the ring, the uploader, the destinations and GDS
// run unchanged in CPU-only CI, under ASan and TSan:
//   device memory  host memory behind addresses that are not canonical
//                  (0x1000'...'): any host access to "device" memory faults,
//                  and every copy is bounds-checked against its allocation;
//                  cudaFree waits for the copies still queued on the memory
//                  (the real one synchronizes the device)
//   pinned memory  page-aligned host memory, registered as pinned
//   streams        one thread each, running copies and event records in order
//   events         generation counters with a condition variable
//   cuFile         pread() into the memory behind a device address
//   NCCL           a single-rank communicator
//   kernels        the host dummy-weight fill
// Faults and delays are injected through Options; Stats counts what happened.
// WEIGHTLIFT_GPU_BACKEND=fake selects it with the default Options.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "gpu/api.h"

namespace wl::gpu::fake {

struct Options {
  int devices = 1;
  uint64_t memory_per_device = uint64_t{64} << 30;  // allocations past it fail (out of memory)
  std::chrono::microseconds copy_delay{0};          // every async copy sleeps this long first
  std::chrono::microseconds host_alloc_delay{0};    // every cudaHostAlloc sleeps this long first
  uint64_t pinned_limit_bytes = 0;                  // cudaHostAlloc past it fails (0: no limit)
  int64_t fail_copy_at = -1;                        // the Nth async copy (0-based, all streams) fails on its stream
  bool cufile = true;                               // cuFile present
  bool cufile_driver_fails = false;                 // cuFileDriverOpen fails
  bool cufile_register_fails = false;               // cuFileHandleRegister fails (filesystem without GDS)
  int64_t cufile_fail_read_at = -1;                 // the Nth cuFileRead (0-based) fails
  // What gds=auto sees of the platform (gds_platform.h; fs_id comes from the
  // file): by default a machine where GDS works (ext4 on NVMe, nvidia-fs).
  GdsPlatform platform{0, "ext4", "nvme", true, false};
  bool machine_platform = false;  // this machine's own facts instead (WEIGHTLIFT_GPU_BACKEND=fake)
  // cuFile's driver properties: an nvidia-fs version and NVMe support, or
  // (compat_only) neither: cuFile would read in compatibility mode only.
  bool cufile_compat_only = false;
  bool kernels = true;  // libweightlift_cuda.so present
  // cudaHostRegister (read-only): supported by the device (its attribute),
  // or refused (cudaErrorNotSupported) as on platforms that will not pin a
  // file mapping.
  bool host_register = true;
  bool host_register_fails = false;
  bool nccl = true;
};

struct Stats {
  std::atomic<uint64_t> async_copies{0}, async_bytes{0};
  std::atomic<uint64_t> pageable_async_copies{0};  // async copies from memory that is not pinned
  std::atomic<uint64_t> slot_overwrites{0};        // a source changed between enqueue and execution
  std::atomic<uint64_t> sync_copies{0};
  std::atomic<uint64_t> cufile_reads{0}, cufile_bytes{0}, cufile_handles{0}, cufile_buffers{0};
  std::atomic<uint64_t> cufile_opens{0}, platform_probes{0};  // cuFileDriverOpen calls; GDS platform probes
  std::atomic<uint64_t> device_allocs{0}, pinned_allocs{0};
  std::atomic<uint64_t> host_registers{0}, host_unregisters{0}, registered_async_copies{0};
  std::atomic<int64_t> host_registered_live{0};  // bytes registered now
  std::atomic<int64_t> device_live{0}, device_peak{0}, pinned_live{0};
};

// The fake's table (and fresh global state) for `options`.
Api make_api(const Options& options);
// Makes a fresh fake the current backend (the old backend, its ring and
// threads are torn down); stats are reset. Every destination and uploader
// made on the old backend must be destroyed first: they hold its memory.
void install(const Options& options = {});
// Back to the backend detected from the machine.
void uninstall();
Stats& stats();

}  // namespace wl::gpu::fake

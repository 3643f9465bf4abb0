// Private: the one GPU function table (see weightlift/gpu.h) and the
// process-wide backend that owns it, its pinned ring and per-device copiers.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/cuda_abi.h"
#include "gpu/gds_platform.h"
#include "weightlift/gpu.h"
#include "weightlift/status.h"

namespace wl::gpu {

enum class BackendKind { kNone, kCuda, kFake };

// Every entry point weightlift calls, filled by loader.cpp (real libraries)
// or fake.cpp (host fake). A section whose library is missing stays null and
// its *_reason says why.
struct Api {
  BackendKind kind = BackendKind::kNone;
  std::string name;  // for backend_name()
  int devices = 0;
  std::string reason;  // why devices == 0
  WlCudaRuntime rt{};  // non-null when devices > 0
  WlCudaDriver drv{};  // real backend: the driver (detection only)
  // Our kernels (libweightlift_cuda.so, or the fake's host fill).
  int (*fill_dummy)(int device, int kind, void* ptr, uint64_t numel, const dummy::Params* params, char* err,
                    size_t errlen) = nullptr;
  std::string kernels_reason;
  bool kernels_loaded = false;  // false: Backend::fill_dummy() loads them on first use
  // cuFile and NCCL are resolved lazily (cufile(), nccl()).
  // fake backend only: the tables it serves instead of the libraries.
  const WlCuFile* fake_cufile = nullptr;
  const WlNccl* fake_nccl = nullptr;
  // fake backend only: the platform facts GDS is decided on (gds_platform.h),
  // instead of this machine's /proc and /sys.
  std::function<GdsPlatform(int fd)> probe_platform;
};

class Ring;
class Copier;

// cuFile, opened (dlopen + cuFileDriverOpen) once, only when a device exists.
struct CuFile {
  const WlCuFile* fn = nullptr;  // null when unusable
  std::string reason;            // why fn is null
};
// NCCL: the table when libnccl (or the fake) is there, else null with a reason.
struct Nccl {
  const WlNccl* fn = nullptr;
  std::string reason;
};

// The backend in use: its table, the pinned ring (created on first use with
// ring_options()) and one copier (streams + completion thread) per device.
class Backend {
 public:
  explicit Backend(Api api);
  ~Backend();
  const Api& api() const { return api_; }
  Result<Ring*> ring();
  bool ring_created() const;
  Result<Copier*> copier(int device);
  const CuFile& cufile();
  const Nccl& nccl();
  // The dummy-weight kernel (libweightlift_cuda.so, loaded on first use), or
  // null with kernels_reason().
  using FillDummyFn = decltype(Api::fill_dummy);
  FillDummyFn fill_dummy();
  std::string kernels_reason();
  // GPUDirect Storage's verdict for a filesystem on a device ("": usable;
  // else why not): `decide` runs once per (device, filesystem) per backend.
  std::string gds_verdict(int device, uint64_t fs_id, const std::function<std::string()>& decide);

 private:
  Api api_;
  mutable std::mutex mu_;
  std::once_flag cufile_once_, nccl_once_, kernels_once_;
  FillDummyFn fill_dummy_ = nullptr;
  std::string kernels_reason_;
  CuFile cufile_;
  Nccl nccl_;
  WlCuFile cufile_fn_{};
  WlNccl nccl_fn_{};
  void touch_context_locked(int device);
  std::vector<bool> contexts_;  // primary context made (or found) per device
  std::mutex gds_mu_;
  std::map<std::pair<int, uint64_t>, std::string> gds_verdicts_;
  std::unique_ptr<Ring> ring_;
  std::vector<std::unique_ptr<Copier>> copiers_;
};

// The current backend: detected on first use (WEIGHTLIFT_GPU_BACKEND=fake
// selects the fake). Lives until the process ends or a test replaces it.
Backend& backend();
// Replaces the backend (tests: fake::install / fake::uninstall). REQUIRES: no
// load, uploader or destination of the old backend is alive.
void replace_backend(std::unique_ptr<Backend> b);
// Forgets set_ring_options() (tests, with a fresh backend).
void reset_ring_options();
// The real backend, detected now (not installed).
Api detect_cuda();

// A runtime status as a Status: kIoError "CUDA: <what>: <error string>".
Status cuda_error(const Api& api, int code, std::string_view what);
// OK when the runtime is usable for `device`.
Status require_device(const Api& api, int device);
// cudaSetDevice for the calling thread.
Status set_device(const Api& api, int device);

// The real cuFile / NCCL libraries, resolved into `out` (loader.cpp).
CuFile load_cufile(const Api& api, WlCuFile* out);
Nccl load_nccl(const Api& api, WlNccl* out);

// The process costs (gpu.h): `ms` added to one of them; set_cost_once sets
// it only while it is 0 (the first load's allocation).
void add_cost(double ProcessCosts::*field, double ms);
void set_cost_once(double ProcessCosts::*field, double ms);
void set_ring_bytes(uint64_t bytes);
// Milliseconds since `t0` (steady clock).
double ms_since(std::chrono::steady_clock::time_point t0);

// Dummy-weight fill on the device (gpu/dummy_fill.cpp calls it).
Status launch_fill_dummy(int kind, void* device_ptr, uint64_t numel, const dummy::Params& params, int device);

}  // namespace wl::gpu

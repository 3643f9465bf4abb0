// The real GPU backend: fills the one function table (api.h) with dlopen().
// Libraries already loaded in the process (torch's) are preferred
// (RTLD_NOLOAD, found in /proc/self/maps), then the usual names. cuFile is
// opened only when a device was detected: its driver open does not return on
// a machine without a GPU.
#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gpu/api.h"
#include "gpu/fake.h"
#include "gpu/ring.h"
#include "util/plugin.h"
#include "weightlift/switches.h"

namespace wl::gpu {

namespace {

constexpr const char* kKernelsLib = "libweightlift_cuda.so";

// Every file mapped into the process (/proc/self/maps), once each: read
// once per lookup round (a torch process maps thousands of regions).
std::vector<std::string> mapped_paths() {
  std::vector<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line, last;
  while (std::getline(maps, line)) {
    auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::string path = line.substr(slash);
    if (path == last) continue;  // a library's regions are adjacent
    last = path;
    out.push_back(std::move(path));
  }
  return out;
}

// The mapped libraries whose file name starts with `stem`.
std::vector<std::string> mapped_libraries(std::string_view stem, const std::vector<std::string>& mapped) {
  std::vector<std::string> out;
  for (const auto& path : mapped) {
    std::string_view base = std::string_view(path).substr(path.rfind('/') + 1);
    if (!base.starts_with(stem)) continue;
    bool seen = false;
    for (auto& p : out) seen |= p == path;
    if (!seen) out.push_back(path);
  }
  return out;
}

// A library of `stem` the process has mapped already, else nullptr.
void* loaded_library(std::string_view stem, std::string* which,
                     const std::vector<std::string>& mapped = mapped_paths()) {
  for (const auto& path : mapped_libraries(stem, mapped)) {
    if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
      *which = path + " (already loaded)";
      return h;
    }
  }
  return nullptr;
}

// A library already in the process, else the first of `names` that opens.
// Handles stay open for the life of the process.
void* open_library(std::string_view stem, const std::vector<std::string>& names, std::string* which,
                   std::string* errors, const std::vector<std::string>& mapped = mapped_paths()) {
  if (void* h = loaded_library(stem, which, mapped)) return h;
  for (const auto& n : names) {
    if (void* h = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *which = n;
      return h;
    }
    if (const char* e = ::dlerror()) *errors += fmt::format("\n  {}", e);
  }
  return nullptr;
}

template <class F>
bool resolve(void* h, const char* name, F* out, std::string* missing) {
  void* p = ::dlsym(h, name);
  if (!p) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

bool resolve_runtime(void* h, WlCudaRuntime* rt, std::string* missing) {
  bool ok = true;
  ok &= resolve(h, "cudaGetDeviceCount", &rt->getDeviceCount, missing);
  ok &= resolve(h, "cudaSetDevice", &rt->setDevice, missing);
  ok &= resolve(h, "cudaGetDevice", &rt->getDevice, missing);
  ok &= resolve(h, "cudaMalloc", &rt->malloc, missing);
  ok &= resolve(h, "cudaFree", &rt->free, missing);
  ok &= resolve(h, "cudaHostAlloc", &rt->hostAlloc, missing);
  ok &= resolve(h, "cudaFreeHost", &rt->freeHost, missing);
  ok &= resolve(h, "cudaMemcpy", &rt->memcpy, missing);
  ok &= resolve(h, "cudaMemcpyAsync", &rt->memcpyAsync, missing);
  ok &= resolve(h, "cudaStreamCreateWithFlags", &rt->streamCreateWithFlags, missing);
  ok &= resolve(h, "cudaStreamDestroy", &rt->streamDestroy, missing);
  ok &= resolve(h, "cudaStreamSynchronize", &rt->streamSynchronize, missing);
  ok &= resolve(h, "cudaEventCreateWithFlags", &rt->eventCreateWithFlags, missing);
  ok &= resolve(h, "cudaEventDestroy", &rt->eventDestroy, missing);
  ok &= resolve(h, "cudaEventRecord", &rt->eventRecord, missing);
  ok &= resolve(h, "cudaEventSynchronize", &rt->eventSynchronize, missing);
  ok &= resolve(h, "cudaEventQuery", &rt->eventQuery, missing);
  ok &= resolve(h, "cudaMemGetInfo", &rt->memGetInfo, missing);
  ok &= resolve(h, "cudaRuntimeGetVersion", &rt->runtimeGetVersion, missing);
  ok &= resolve(h, "cudaGetLastError", &rt->getLastError, missing);
  ok &= resolve(h, "cudaGetErrorString", &rt->getErrorString, missing);
  ok &= resolve(h, "cudaHostRegister", &rt->hostRegister, missing);
  ok &= resolve(h, "cudaHostUnregister", &rt->hostUnregister, missing);
  ok &= resolve(h, "cudaDeviceGetAttribute", &rt->deviceGetAttribute, missing);
  return ok;
}

// libweightlift_cuda.so: $WEIGHTLIFT_CUDA_LIBRARY, next to this library or
// binary (., ../lib), the loader's search path.
const WlCudaApi* load_kernels(std::string* reason, const std::vector<std::string>& mapped = mapped_paths()) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> candidates =
      plugin_candidates(kKernelsLib, "WEIGHTLIFT_CUDA_LIBRARY", reinterpret_cast<void*>(&detect_cuda));
  std::string which, errors;
  void* h = open_library(kKernelsLib, candidates, &which, &errors, mapped);
  add_cost(&ProcessCosts::kernels_ms, ms_since(t0));
  if (!h) {
    *reason = fmt::format("the CUDA kernels ({}) are not installed or cannot be loaded{}", kKernelsLib, errors);
    return nullptr;
  }
  auto get = reinterpret_cast<const WlCudaApi* (*)()>(::dlsym(h, "wl_cuda_api"));
  const WlCudaApi* api = get ? get() : nullptr;
  if (!api || api->abi_version != kWlCudaAbiVersion) {
    *reason = fmt::format("{} ({}) does not match this weightlift build", kKernelsLib, which);
    return nullptr;
  }
  return api;
}

std::string driver_error(const WlCudaDriver& d, int code) {
  const char* s = nullptr;
  if (d.getErrorString && d.getErrorString(code, &s) == 0 && s) return fmt::format("{} ({})", s, code);
  return fmt::format("error {}", code);
}

}  // namespace

Api detect_cuda() {
  Api a;
  a.kind = BackendKind::kNone;
  a.name = "none";
  // 1. The driver: tells "no driver" from "no device".
  const std::vector<std::string> mapped = mapped_paths();  // read once for every lookup below
  std::string which, errors;
  void* drv = open_library("libcuda.so", {"libcuda.so.1"}, &which, &errors, mapped);
  if (!drv) {
    a.reason = "no NVIDIA driver: libcuda.so.1 is not installed (no CUDA-capable GPU driver on this machine)";
    return a;
  }
  std::string missing;
  bool ok = resolve(drv, "cuInit", &a.drv.init, &missing) &&
            resolve(drv, "cuDeviceGetCount", &a.drv.deviceGetCount, &missing) &&
            resolve(drv, "cuDriverGetVersion", &a.drv.driverGetVersion, &missing);
  (void)resolve(drv, "cuGetErrorString", &a.drv.getErrorString, &missing);
  if (!ok) {
    a.reason = fmt::format("the NVIDIA driver library {} lacks {}", which, missing);
    return a;
  }
  int rc = a.drv.init(0);
  if (rc == kCuErrorStubLibrary) {
    a.reason = fmt::format("no NVIDIA driver: {} is the CUDA toolkit's stub library, not a driver", which);
    return a;
  }
  if (rc == kCuErrorNoDevice) {
    a.reason = "no CUDA device: the NVIDIA driver is installed but reports no GPU";
    return a;
  }
  if (rc != 0) {
    a.reason = fmt::format("the NVIDIA driver failed to initialise: {}", driver_error(a.drv, rc));
    return a;
  }
  int count = 0;
  if (int r = a.drv.deviceGetCount(&count); r != 0 || count <= 0) {
    a.reason = r != 0 ? fmt::format("the NVIDIA driver cannot count devices: {}", driver_error(a.drv, r))
                      : std::string("no CUDA device: the NVIDIA driver reports no GPU");
    return a;
  }

  // 2. The runtime: one the process has (torch's), $WEIGHTLIFT_CUDART, the
  //    static runtime of our kernels' library, the usual names. The kernels
  //    (dummy weights) are loaded here only when their runtime serves;
  //    otherwise on first use (Backend::fill_dummy).
  std::string rt_which, rt_errors;
  void* rt = loaded_library("libcudart.so", &rt_which, mapped);
  if (!rt) {
    if (const std::string env = read_switches().cudart; !env.empty()) {
      rt = ::dlopen(env.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (rt)
        rt_which = env;
      else if (const char* e = ::dlerror())
        rt_errors += fmt::format("\n  {}", e);
    }
  }
  const WlCudaApi* kernels = nullptr;
  if (!rt) {
    kernels = load_kernels(&a.kernels_reason, mapped);
    a.kernels_loaded = true;
    if (kernels) a.fill_dummy = kernels->fill_dummy;
  }
  if (!rt && kernels) {
    a.rt = kernels->runtime;
    rt_which = std::string(kKernelsLib) + " (static runtime)";
  } else {
    if (!rt)
      rt = open_library("libcudart.so",
                        {"libcudart.so.13", "libcudart.so.12", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so"},
                        &rt_which, &rt_errors, mapped);
    if (!rt) {
      a.reason = fmt::format("the CUDA runtime library (libcudart.so) is not installed, and {}{}", a.kernels_reason,
                             rt_errors);
      return a;
    }
    std::string rt_missing;
    if (!resolve_runtime(rt, &a.rt, &rt_missing)) {
      a.reason = fmt::format("the CUDA runtime {} lacks {}", rt_which, rt_missing);
      a.rt = {};
      return a;
    }
  }
  int n = 0;
  if (int r = a.rt.getDeviceCount(&n); r != 0 || n <= 0) {
    (void)a.rt.getLastError();  // clear the sticky error
    a.reason = r != 0 ? fmt::format("the CUDA runtime ({}) cannot use the driver: {}", rt_which,
                                    a.rt.getErrorString ? a.rt.getErrorString(r) : "error")
                      : std::string("no CUDA device");
    a.rt = {};
    return a;
  }
  a.kind = BackendKind::kCuda;
  a.devices = n;
  a.name = fmt::format("cuda (runtime: {})", rt_which);
  return a;
}

CuFile load_cufile(const Api& api, WlCuFile* out) {
  CuFile c;
  if (api.devices == 0) {
    c.reason = "no CUDA device";
    return c;
  }
  std::string which, errors;
  void* h = open_library("libcufile.so", {"libcufile.so.0", "libcufile.so", "/usr/local/cuda/lib64/libcufile.so.0"},
                         &which, &errors);
  if (!h) {
    c.reason = "cuFile (libcufile.so.0) is not installed";
    return c;
  }
  std::string missing;
  bool ok = resolve(h, "cuFileDriverOpen", &out->driverOpen, &missing) &&
            resolve(h, "cuFileHandleRegister", &out->handleRegister, &missing) &&
            resolve(h, "cuFileHandleDeregister", &out->handleDeregister, &missing) &&
            resolve(h, "cuFileBufRegister", &out->bufRegister, &missing) &&
            resolve(h, "cuFileBufDeregister", &out->bufDeregister, &missing) &&
            resolve(h, "cuFileRead", &out->read, &missing);
  std::string optional;
  (void)resolve(h, "cuFileDriverGetProperties", &out->driverGetProperties, &optional);
  if (!ok) {
    c.reason = fmt::format("cuFile ({}) lacks {}", which, missing);
    return c;
  }
  WlCuFileError e = out->driverOpen();
  if (e.err != 0) {
    c.reason = fmt::format("cuFileDriverOpen failed (cuFile error {}, CUDA error {})", e.err, e.cu_err);
    return c;
  }
  c.fn = out;
  return c;
}

Nccl load_nccl(const Api& api, WlNccl* out) {
  Nccl n;
  if (api.devices == 0) {
    n.reason = "no CUDA device";
    return n;
  }
  std::string which, errors;
  void* h =
      open_library("libnccl.so", {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"}, &which, &errors);
  if (!h) {
    n.reason = "NCCL (libnccl.so.2) is not installed";
    return n;
  }
  std::string missing;
  bool ok = resolve(h, "ncclGetVersion", &out->getVersion, &missing) &&
            resolve(h, "ncclGetUniqueId", &out->getUniqueId, &missing) &&
            resolve(h, "ncclCommInitRank", &out->commInitRank, &missing) &&
            resolve(h, "ncclCommDestroy", &out->commDestroy, &missing) &&
            resolve(h, "ncclAllGather", &out->allGather, &missing) &&
            resolve(h, "ncclBroadcast", &out->broadcast, &missing) &&
            resolve(h, "ncclGetErrorString", &out->getErrorString, &missing) &&
            resolve(h, "ncclCommCount", &out->commCount, &missing) &&
            resolve(h, "ncclCommUserRank", &out->commUserRank, &missing) &&
            resolve(h, "ncclCommAbort", &out->commAbort, &missing) &&
            resolve(h, "ncclCommGetAsyncError", &out->commGetAsyncError, &missing);
  if (!ok) {
    n.reason = fmt::format("NCCL ({}) lacks {}", which, missing);
    return n;
  }
  n.fn = out;
  return n;
}

// ---- the process-wide backend ----------------------------------------------------

namespace {

std::mutex g_backend_mu;
std::unique_ptr<Backend>& backend_slot() {
  static std::unique_ptr<Backend> b;
  return b;
}

Api initial_api() {
  const Switches sw = read_switches();
  const std::string& s = sw.gpu_backend;
  if (s == "fake") {
    fake::Options o;
    o.machine_platform = true;  // GDS decided on this machine's filesystem and drivers
    if (sw.fake_gpus) o.devices = *sw.fake_gpus;
    return fake::make_api(o);
  }
  Api a = detect_cuda();
  if (!s.empty() && s != "cuda" && s != "auto")
    a.reason = fmt::format("WEIGHTLIFT_GPU_BACKEND='{}' is not a backend (expected cuda or fake); ", s) + a.reason;
  return a;
}

}  // namespace

// ---- what a process pays once ------------------------------------------------------

namespace {

std::mutex g_costs_mu;
ProcessCosts g_costs;

}  // namespace

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void add_cost(double ProcessCosts::*field, double ms) {
  std::lock_guard lk(g_costs_mu);
  g_costs.*field += ms;
}

void set_cost_once(double ProcessCosts::*field, double ms) {
  std::lock_guard lk(g_costs_mu);
  if (g_costs.*field == 0) g_costs.*field = ms;
}

void set_ring_bytes(uint64_t bytes) {
  std::lock_guard lk(g_costs_mu);
  g_costs.ring_bytes = bytes;
}

ProcessCosts process_costs() {
  std::lock_guard lk(g_costs_mu);
  return g_costs;
}

std::string ProcessCosts::to_string() const {
  std::string out;
  auto part = [&](const char* what, double ms) {
    if (ms <= 0) return;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {:.3g} ms", what, ms);
  };
  part("detect", detect_ms);
  part("kernels library", kernels_ms);
  part("context", context_ms);
  if (ring_ms > 0) part(fmt::format("ring {} MiB (first 8 slots)", ring_bytes >> 20).c_str(), ring_ms);
  part("the ring's other slots, in the background", ring_grow_ms);
  part("copier", copier_ms);
  part("GDS platform probe", gds_probe_ms);
  part("cuFile open", cufile_ms);
  part("first device allocation", first_allocation_ms);
  if (out.empty()) return "nothing yet";
  if (warm_up) out += " (detection, context, ring and copier on the warm-up thread)";
  return out;
}

// ---- warm-up -----------------------------------------------------------------------

namespace {

struct WarmUp {
  std::mutex mu;
  std::thread thread;
  bool started = false;
  void join() {
    std::thread t;
    {
      std::lock_guard lk(mu);
      t = std::move(thread);
    }
    if (t.joinable()) t.join();
  }
  ~WarmUp() { join(); }
};

WarmUp& warm_up_state() {
  (void)backend_slot();  // constructed first, so destroyed after the warm-up thread was joined
  static WarmUp w;
  return w;
}

bool warm_up_enabled() { return read_switches().gpu_warm_up; }

}  // namespace

void warm_up(Device device) {
  if (device.kind == DeviceKind::kCpu || !warm_up_enabled()) return;
  WarmUp& w = warm_up_state();
  std::lock_guard lk(w.mu);
  if (w.started) return;
  w.started = true;
  w.thread = std::thread([device] {
    Backend& b = backend();
    const int d = device.kind == DeviceKind::kCuda ? device.index : 0;
    if (b.api().devices <= d || d < 0) return;
    bool ok = b.ring().ok();
    if (ok && device.kind == DeviceKind::kCuda) ok = b.copier(d).ok();
    if (ok) {
      std::lock_guard c(g_costs_mu);
      g_costs.warm_up = true;
    }
  });
}

void wait_warm_up() { warm_up_state().join(); }

// ---- the backend ---------------------------------------------------------------------

Backend& backend() {
  std::lock_guard lk(g_backend_mu);
  auto& b = backend_slot();
  if (!b) {
    const auto t0 = std::chrono::steady_clock::now();
    b = std::make_unique<Backend>(initial_api());
    add_cost(&ProcessCosts::detect_ms, ms_since(t0));
  }
  return *b;
}

void replace_backend(std::unique_ptr<Backend> b) {
  WarmUp& w = warm_up_state();
  w.join();  // never under g_backend_mu: the warm-up thread takes it
  {
    std::lock_guard lk(w.mu);
    w.started = false;
  }
  std::unique_ptr<Backend> old;
  {
    std::lock_guard lk(g_backend_mu);
    old = std::exchange(backend_slot(), std::move(b));
  }
  old.reset();  // outside the lock: its copiers join their threads
}

Backend::Backend(Api api) : api_(std::move(api)) {}

Backend::~Backend() {
  copiers_.clear();  // join the completion threads before the ring goes
  ring_.reset();
}

// The device's primary context, made now (cudaFree(0)) and timed, the first
// time this backend needs it; torch's context is reused when it made one.
void Backend::touch_context_locked(int device) {
  if (contexts_.size() < static_cast<size_t>(api_.devices)) contexts_.resize(static_cast<size_t>(api_.devices), false);
  if (device < 0 || device >= api_.devices || contexts_[static_cast<size_t>(device)]) return;
  contexts_[static_cast<size_t>(device)] = true;
  const auto t0 = std::chrono::steady_clock::now();
  int before = -1;
  if (api_.rt.getDevice(&before) != 0) before = -1;
  if (api_.rt.setDevice(device) == 0) (void)api_.rt.free(nullptr);
  if (before >= 0 && before != device) (void)api_.rt.setDevice(before);  // the caller's thread keeps its device
  add_cost(&ProcessCosts::context_ms, ms_since(t0));
}

Result<Ring*> Backend::ring() {
  std::lock_guard lk(mu_);
  if (!ring_) {
    WL_RETURN_IF_ERROR(require_device(api_, 0));
    WL_ASSIGN_OR_RETURN(RingOptions o, ring_options());
    touch_context_locked(0);  // the ring is allocated on device 0's context
    const auto t0 = std::chrono::steady_clock::now();
    WL_ASSIGN_OR_RETURN(ring_, Ring::create(api_, o));
    add_cost(&ProcessCosts::ring_ms, ms_since(t0));
    set_ring_bytes(uint64_t{o.slots} * o.slot_bytes);
  }
  return ring_.get();
}

bool Backend::ring_created() const {
  std::lock_guard lk(mu_);
  return ring_ != nullptr;
}

Result<Copier*> Backend::copier(int device) {
  WL_RETURN_IF_ERROR(require_device(api_, device));
  WL_ASSIGN_OR_RETURN(Ring * r, ring());
  std::lock_guard lk(mu_);
  if (copiers_.size() < static_cast<size_t>(api_.devices)) copiers_.resize(static_cast<size_t>(api_.devices));
  auto& c = copiers_[static_cast<size_t>(device)];
  if (!c) {
    WL_ASSIGN_OR_RETURN(RingOptions o, ring_options());
    touch_context_locked(device);
    const auto t0 = std::chrono::steady_clock::now();
    WL_ASSIGN_OR_RETURN(c, Copier::create(api_, device, o.streams, r));
    add_cost(&ProcessCosts::copier_ms, ms_since(t0));
  }
  return c.get();
}

Backend::FillDummyFn Backend::fill_dummy() {
  std::call_once(kernels_once_, [&] {
    fill_dummy_ = api_.fill_dummy;
    kernels_reason_ = api_.kernels_reason;
    if (api_.kernels_loaded || api_.kind != BackendKind::kCuda) return;
    if (const WlCudaApi* k = load_kernels(&kernels_reason_)) fill_dummy_ = k->fill_dummy;
  });
  return fill_dummy_;
}

std::string Backend::kernels_reason() {
  (void)fill_dummy();
  return kernels_reason_;
}

const CuFile& Backend::cufile() {
  std::call_once(cufile_once_, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    struct Timed {
      std::chrono::steady_clock::time_point t0;
      ~Timed() { add_cost(&ProcessCosts::cufile_ms, ms_since(t0)); }
    } timed{t0};
    if (api_.kind == BackendKind::kFake) {
      cufile_.fn = api_.fake_cufile;
      if (!cufile_.fn) cufile_.reason = "cuFile is not installed (fake backend)";
      if (cufile_.fn) {
        WlCuFileError e = cufile_.fn->driverOpen();
        if (e.err != 0) {
          cufile_.reason = fmt::format("cuFileDriverOpen failed (cuFile error {}, CUDA error {})", e.err, e.cu_err);
          cufile_.fn = nullptr;
        }
      }
      return;
    }
    cufile_ = load_cufile(api_, &cufile_fn_);
  });
  return cufile_;
}

std::string Backend::gds_verdict(int device, uint64_t fs_id, const std::function<std::string()>& decide) {
  std::lock_guard lk(gds_mu_);  // one decision at a time: each may open cuFile
  auto key = std::make_pair(device, fs_id);
  if (auto it = gds_verdicts_.find(key); it != gds_verdicts_.end()) return it->second;
  return gds_verdicts_[key] = decide();
}

const Nccl& Backend::nccl() {
  std::call_once(nccl_once_, [&] {
    if (api_.kind == BackendKind::kFake) {
      nccl_.fn = api_.fake_nccl;
      if (!nccl_.fn) nccl_.reason = "NCCL is not installed (fake backend)";
      return;
    }
    nccl_ = load_nccl(api_, &nccl_fn_);
  });
  return nccl_;
}

Status cuda_error(const Api& api, int code, std::string_view what) {
  const char* s = api.rt.getErrorString ? api.rt.getErrorString(code) : nullptr;
  return Status::IoError(fmt::format("CUDA: {}: {} (error {})", what, s ? s : "unknown error", code));
}

Status require_device(const Api& api, int device) {
  if (api.devices <= 0) return Status::Unavailable(api.reason.empty() ? std::string("no CUDA device") : api.reason);
  if (device < 0 || device >= api.devices)
    return Status::InvalidArgument(fmt::format("no CUDA device {} (there are {})", device, api.devices));
  return Status();
}

Status set_device(const Api& api, int device) {
  WL_RETURN_IF_ERROR(require_device(api, device));
  if (int rc = api.rt.setDevice(device); rc != 0) return cuda_error(api, rc, fmt::format("cudaSetDevice({})", device));
  return Status();
}

Status launch_fill_dummy(int kind, void* device_ptr, uint64_t numel, const dummy::Params& params, int device) {
  Backend& b = backend();
  WL_RETURN_IF_ERROR(require_device(b.api(), device));
  auto fill = b.fill_dummy();
  if (!fill) return Status::Unavailable(b.kernels_reason());
  char err[256] = {};
  if (fill(device, kind, device_ptr, numel, &params, err, sizeof err) != 0)
    return Status::IoError(std::string("CUDA: ") + err);
  return Status();
}

}  // namespace wl::gpu

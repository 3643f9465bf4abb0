// The host fake GPU backend (see fake.h).
#include "gpu/fake.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "weightlift/dummy.h"
#include "weightlift/tensor.h"

namespace wl::gpu::fake {

namespace {

constexpr int kIllegalAddress = 700;                        // cudaErrorIllegalAddress
constexpr uintptr_t kDeviceBase = uintptr_t{0x1000} << 48;  // not a canonical x86-64/arm64 address
constexpr uintptr_t kGap = uintptr_t{1} << 20;

struct Alloc {
  Buffer host;
  uint64_t size = 0;
  bool device = false;
  int index = 0;
  bool registered = false;  // the caller's memory, page-locked by cudaHostRegister
  // Device memory: asynchronous copies queued on it that have not run yet
  // (cudaFree waits for them, as the real one waits for the device's work).
  std::shared_ptr<std::atomic<int64_t>> queued = std::make_shared<std::atomic<int64_t>>(0);
};

// All of the fake's state: one instance per make_api().
struct State {
  Options o;
  std::shared_mutex mu;
  std::map<uintptr_t, Alloc> allocs;  // by the address handed out
  uintptr_t next_device = kDeviceBase;
  std::vector<int64_t> used;  // bytes per device
  std::atomic<int64_t> copy_index{0}, read_index{0};
  std::atomic<int> driver_open{0};

  // The allocation holding [p, p+n), or null.
  Alloc* find(const void* p, uint64_t n, uintptr_t* base) {
    auto a = reinterpret_cast<uintptr_t>(p);
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return nullptr;
    --it;
    if (a - it->first > it->second.size || n > it->second.size - (a - it->first)) return nullptr;
    *base = it->first;
    return &it->second;
  }
  // Host memory behind device address p (n bytes), or null.
  std::byte* device_bytes(const void* p, uint64_t n) {
    std::shared_lock lk(mu);
    uintptr_t base = 0;
    Alloc* a = find(p, n, &base);
    if (!a || !a->device) return nullptr;
    return a->host.data() + (reinterpret_cast<uintptr_t>(p) - base);
  }
  bool is_device(const void* p) {
    std::shared_lock lk(mu);
    uintptr_t base = 0;
    Alloc* a = find(p, 1, &base);
    return a && a->device;
  }
  bool is_pinned(const void* p, uint64_t n) {
    std::shared_lock lk(mu);
    uintptr_t base = 0;
    Alloc* a = find(p, n, &base);
    return a && !a->device;
  }
  bool is_registered(const void* p, uint64_t n) {
    std::shared_lock lk(mu);
    uintptr_t base = 0;
    Alloc* a = find(p, n, &base);
    return a && a->registered;
  }
  // The queued-copy count of the device allocation holding p, or null.
  std::shared_ptr<std::atomic<int64_t>> queued_on(const void* p) {
    std::shared_lock lk(mu);
    uintptr_t base = 0;
    Alloc* a = find(p, 1, &base);
    return a && a->device ? a->queued : nullptr;
  }
};

State* g_state = nullptr;
std::mutex g_state_mu;
// A stream ran a copy out of or into device memory (device_free waits on it).
std::mutex g_ran_mu;
std::condition_variable g_ran_cv;
Stats g_stats;
thread_local int t_device = 0;

State& S() { return *g_state; }

uint64_t digest(const std::byte* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ static_cast<uint64_t>(p[i])) * 1099511628211ull;
  return h;
}

void bump_peak(int64_t live) {
  int64_t peak = g_stats.device_peak.load();
  while (live > peak && !g_stats.device_peak.compare_exchange_weak(peak, live)) {}
}

// ---- events and streams -------------------------------------------------------------

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0, completed = 0;
  int status = 0;
};

struct Op {
  enum Kind { kCopy, kRecord } kind = kCopy;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  uint64_t n = 0;
  uint64_t src_digest = 0;
  bool fail = false;
  Event* event = nullptr;
  uint64_t generation = 0;
  std::shared_ptr<std::atomic<int64_t>> uses[2];  // the device allocations it reads or writes
};

class Stream {
 public:
  Stream() : thread_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(Op op) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(op);
    }
    cv_.notify_all();
  }

 private:
  void run() {
    int error = 0;  // the first failure since the last event record
    while (true) {
      Op op;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (q_.empty()) return;
        op = q_.front();
        q_.pop_front();
      }
      if (op.kind == Op::kCopy) {
        if (S().o.copy_delay.count() > 0) std::this_thread::sleep_for(S().o.copy_delay);
        if (op.fail) {
          if (!error) error = kIllegalAddress;
        } else {
          if (digest(op.src, op.n) != op.src_digest) g_stats.slot_overwrites++;
          std::memcpy(op.dst, op.src, op.n);
        }
        ran(op);
        continue;
      }
      std::lock_guard lk(op.event->mu);
      if (op.generation == op.event->recorded) {
        op.event->status = error;
        op.event->completed = op.generation;
      }
      error = 0;
      op.event->cv.notify_all();
    }
  }

  static void ran(const Op& op) {
    bool device = false;
    for (auto& u : op.uses)
      if (u) device = true, u->fetch_sub(1);
    if (!device) return;
    { std::lock_guard lk(g_ran_mu); }
    g_ran_cv.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> q_;
  bool stop_ = false;
  std::thread thread_;
};

// ---- the runtime ------------------------------------------------------------------------

int get_device_count(int* n) {
  *n = S().o.devices;
  return S().o.devices > 0 ? 0 : kCudaErrorNoDevice;
}
int set_device(int d) {
  if (d < 0 || d >= S().o.devices) return kCudaErrorInvalidValue;
  t_device = d;
  return 0;
}
int get_device(int* d) {
  *d = t_device;
  return 0;
}

int device_malloc(void** out, size_t n) {
  State& s = S();
  auto host = Buffer::allocate(std::max<size_t>(n, 1), 256);
  if (!host.ok()) return kCudaErrorMemoryAllocation;
  std::unique_lock lk(s.mu);
  if (s.used[static_cast<size_t>(t_device)] + static_cast<int64_t>(n) > static_cast<int64_t>(s.o.memory_per_device))
    return kCudaErrorMemoryAllocation;
  s.used[static_cast<size_t>(t_device)] += static_cast<int64_t>(n);
  uintptr_t addr = s.next_device;
  s.next_device += ((n + 4095) & ~uintptr_t{4095}) + kGap;
  s.allocs.emplace(addr, Alloc{std::move(*host), n, true, t_device});
  *out = reinterpret_cast<void*>(addr);
  g_stats.device_allocs++;
  bump_peak(g_stats.device_live += static_cast<int64_t>(n));
  return 0;
}

int device_free(void* p) {
  if (!p) return 0;
  State& s = S();
  // cudaFree synchronizes: copies still queued on this memory run first.
  if (auto queued = s.queued_on(p)) {
    std::unique_lock lk(g_ran_mu);
    g_ran_cv.wait(lk, [&] { return queued->load() == 0; });
  }
  std::unique_lock lk(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || !it->second.device) return kCudaErrorInvalidValue;
  s.used[static_cast<size_t>(it->second.index)] -= static_cast<int64_t>(it->second.size);
  g_stats.device_live -= static_cast<int64_t>(it->second.size);
  s.allocs.erase(it);
  return 0;
}

int host_alloc(void** out, size_t n, unsigned) {
  if (S().o.host_alloc_delay.count() > 0) std::this_thread::sleep_for(S().o.host_alloc_delay);
  if (S().o.pinned_limit_bytes > 0 &&
      g_stats.pinned_live + static_cast<int64_t>(n) > static_cast<int64_t>(S().o.pinned_limit_bytes))
    return kCudaErrorMemoryAllocation;
  auto host = Buffer::allocate(std::max<size_t>(n, 1), 4096);
  if (!host.ok()) return kCudaErrorMemoryAllocation;
  State& s = S();
  std::unique_lock lk(s.mu);
  auto addr = reinterpret_cast<uintptr_t>(host->data());
  s.allocs.emplace(addr, Alloc{std::move(*host), n, false, 0});
  *out = reinterpret_cast<void*>(addr);
  g_stats.pinned_allocs++;
  g_stats.pinned_live += static_cast<int64_t>(n);
  return 0;
}

int host_register(void* p, size_t n, unsigned flags) {
  State& s = S();
  if (!s.o.host_register || s.o.host_register_fails) return kCudaErrorNotSupported;
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (n == 0 || a % 4096 != 0 || !(flags & kCudaHostRegisterReadOnly)) return kCudaErrorInvalidValue;
  std::unique_lock lk(s.mu);
  // No overlap with another registration or pinned allocation (the real one refuses it too).
  auto it = s.allocs.upper_bound(a + n - 1);
  if (it != s.allocs.begin()) {
    --it;
    if (it->first + std::max<uint64_t>(it->second.size, 1) > a) return kCudaErrorHostMemoryAlreadyRegistered;
  }
  s.allocs.emplace(a, Alloc{Buffer(), n, false, 0, true});
  g_stats.host_registers++;
  g_stats.host_registered_live += static_cast<int64_t>(n);
  return 0;
}

int host_unregister(void* p) {
  State& s = S();
  std::unique_lock lk(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || !it->second.registered) return kCudaErrorHostMemoryNotRegistered;
  g_stats.host_unregisters++;
  g_stats.host_registered_live -= static_cast<int64_t>(it->second.size);
  s.allocs.erase(it);
  return 0;
}

int device_attribute(int* v, int attr, int device) {
  if (device < 0 || device >= S().o.devices) return kCudaErrorInvalidValue;
  *v = attr == kCudaDevAttrHostRegisterReadOnlySupported ? (S().o.host_register ? 1 : 0) : 0;
  return 0;
}

int free_host(void* p) {
  if (!p) return 0;
  State& s = S();
  std::unique_lock lk(s.mu);
  auto it = s.allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.allocs.end() || it->second.device || it->second.registered) return kCudaErrorInvalidValue;
  g_stats.pinned_live -= static_cast<int64_t>(it->second.size);
  s.allocs.erase(it);
  return 0;
}

// Resolves a copy: host pointers for both ends, or an error code.
int resolve_copy(void* dst, const void* src, size_t n, int kind, std::byte** d, const std::byte** sp) {
  State& s = S();
  bool dst_dev = s.is_device(dst), src_dev = s.is_device(src);
  if (kind == kCudaMemcpyHostToDevice && (!dst_dev || src_dev)) return kCudaErrorInvalidValue;
  if (kind == kCudaMemcpyDeviceToHost && (dst_dev || !src_dev)) return kCudaErrorInvalidValue;
  *d = dst_dev ? s.device_bytes(dst, n) : static_cast<std::byte*>(dst);
  *sp = src_dev ? s.device_bytes(src, n) : static_cast<const std::byte*>(src);
  if (!*d || !*sp) return kCudaErrorInvalidValue;  // past the end of its allocation
  return 0;
}

int memcpy_sync(void* dst, const void* src, size_t n, int kind) {
  if (n == 0) return 0;
  std::byte* d = nullptr;
  const std::byte* sp = nullptr;
  if (int rc = resolve_copy(dst, src, n, kind, &d, &sp)) return rc;
  std::memcpy(d, sp, n);
  g_stats.sync_copies++;
  return 0;
}

int memcpy_async(void* dst, const void* src, size_t n, int kind, void* stream) {
  if (!stream) return kCudaErrorInvalidValue;
  if (n == 0) return 0;
  std::byte* d = nullptr;
  const std::byte* sp = nullptr;
  if (int rc = resolve_copy(dst, src, n, kind, &d, &sp)) return rc;
  if (!S().is_pinned(src, n) && !S().is_device(src)) g_stats.pageable_async_copies++;
  if (S().is_registered(src, n)) g_stats.registered_async_copies++;
  Op op;
  op.kind = Op::kCopy;
  op.dst = d;
  op.src = sp;
  op.n = n;
  op.src_digest = digest(sp, n);
  op.fail = S().copy_index++ == S().o.fail_copy_at;
  op.uses[0] = S().queued_on(dst);
  op.uses[1] = S().queued_on(src);
  for (auto& u : op.uses)
    if (u) u->fetch_add(1);
  g_stats.async_copies++;
  g_stats.async_bytes += n;
  static_cast<Stream*>(stream)->push(op);
  return 0;
}

int stream_create(void** s, unsigned) {
  *s = new Stream();
  return 0;
}
int stream_destroy(void* s) {
  delete static_cast<Stream*>(s);
  return 0;
}
int event_create(void** e, unsigned) {
  *e = new Event();
  return 0;
}
int event_destroy(void* e) {
  delete static_cast<Event*>(e);
  return 0;
}
int event_record(void* e, void* s) {
  if (!e || !s) return kCudaErrorInvalidValue;
  auto* ev = static_cast<Event*>(e);
  Op op;
  op.kind = Op::kRecord;
  op.event = ev;
  {
    std::lock_guard lk(ev->mu);
    op.generation = ++ev->recorded;
  }
  static_cast<Stream*>(s)->push(op);
  return 0;
}
int event_synchronize(void* e) {
  auto* ev = static_cast<Event*>(e);
  std::unique_lock lk(ev->mu);
  ev->cv.wait(lk, [&] { return ev->completed >= ev->recorded; });
  return ev->status;
}
int event_query(void* e) {
  auto* ev = static_cast<Event*>(e);
  std::lock_guard lk(ev->mu);
  return ev->completed >= ev->recorded ? ev->status : kCudaErrorNotReady;
}
int stream_synchronize(void* s) {
  Event ev;
  if (int rc = event_record(&ev, s)) return rc;
  return event_synchronize(&ev);
}
int mem_get_info(size_t* free_bytes, size_t* total) {
  std::shared_lock lk(S().mu);
  *total = S().o.memory_per_device;
  *free_bytes =
      static_cast<size_t>(static_cast<int64_t>(S().o.memory_per_device) - S().used[static_cast<size_t>(t_device)]);
  return 0;
}
int runtime_version(int* v) {
  *v = 13000;
  return 0;
}
int last_error() { return 0; }
const char* error_string(int e) {
  switch (e) {
    case 0: return "no error";
    case kCudaErrorInvalidValue: return "invalid argument";
    case kCudaErrorMemoryAllocation: return "out of memory";
    case kCudaErrorNoDevice: return "no CUDA-capable device is detected";
    case kCudaErrorNotReady: return "device not ready";
    case kIllegalAddress: return "an illegal memory access was encountered";
    case kCudaErrorNotSupported: return "operation not supported";
    case kCudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case kCudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    default: return "unknown error";
  }
}

// ---- kernels ------------------------------------------------------------------------------

int fill_dummy(int device, int kind, void* ptr, uint64_t numel, const dummy::Params* p, char* err, size_t errlen) {
  if (numel == 0) return 0;
  if (device < 0 || device >= S().o.devices) {
    std::snprintf(err, errlen, "cudaSetDevice: invalid device ordinal");
    return kCudaErrorInvalidValue;
  }
  const uint64_t size = kind == dummy::kF64 ? 8 : kind == dummy::kF32 ? 4 : kind <= dummy::kBF16 ? 2 : 1;
  std::byte* host = S().device_bytes(ptr, numel * size);
  if (!host) {
    std::snprintf(err, errlen, "dummy-weight kernel: %s", error_string(kIllegalAddress));
    return kIllegalAddress;
  }
  dummy::fill_host(kind, host, 0, numel, *p);
  return 0;
}

// ---- cuFile -------------------------------------------------------------------------------

struct FileHandle {
  int fd;
};

WlCuFileError cufile_open() {
  g_stats.cufile_opens++;
  if (S().o.cufile_driver_fails) return {5001, 0};  // CU_FILE_DRIVER_NOT_INITIALIZED
  S().driver_open = 1;
  return {0, 0};
}
WlCuFileError cufile_register(void** h, WlCuFileDescr* d) {
  if (!S().driver_open) return {5001, 0};
  if (d->type != kCuFileHandleTypeOpaqueFd || d->handle.fd < 0) return {5016, 0};
  if (S().o.cufile_register_fails) return {5030, 0};  // the filesystem does not support GDS
  // cuFile reads any offset and length, also from an O_DIRECT descriptor
  // (through its own bounce buffers); the fake reads a plain descriptor of
  // the same file.
  int fd = ::open(fmt::format("/proc/self/fd/{}", d->handle.fd).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {5016, 0};
  *h = new FileHandle{fd};
  g_stats.cufile_handles++;
  return {0, 0};
}
void cufile_deregister(void* h) {
  ::close(static_cast<FileHandle*>(h)->fd);
  delete static_cast<FileHandle*>(h);
}
WlCuFileError cufile_buf_register(const void* p, size_t n, int) {
  if (!S().device_bytes(p, n)) return {5004, 0};
  g_stats.cufile_buffers++;
  return {0, 0};
}
WlCuFileError cufile_buf_deregister(const void*) { return {0, 0}; }
ssize_t cufile_read(void* h, void* base, size_t n, off_t file_off, off_t dev_off) {
  if (S().read_index++ == S().o.cufile_fail_read_at) return -5011;
  std::byte* dst = S().device_bytes(static_cast<std::byte*>(base) + dev_off, n);
  if (!dst) return -5004;
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(static_cast<FileHandle*>(h)->fd, dst + done, n - done, file_off + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  g_stats.cufile_reads++;
  g_stats.cufile_bytes += done;
  return static_cast<ssize_t>(done);
}

WlCuFileError cufile_properties(WlCuFileDrvProps* p) {
  if (!S().driver_open) return {5001, 0};
  *p = {};
  if (!S().o.cufile_compat_only) {
    p->nvfs.major_version = 2, p->nvfs.minor_version = 26;
    p->nvfs.dstatusflags = (1u << kCuFileNvmeSupported) | (1u << kCuFileNfsSupported);
  }
  p->nvfs.dcontrolflags = 1u << 1;  // CU_FILE_ALLOW_COMPAT_MODE
  return {0, 0};
}

const WlCuFile kCuFile = {cufile_open,           cufile_register, cufile_deregister, cufile_buf_register,
                          cufile_buf_deregister, cufile_read,     cufile_properties};

// ---- NCCL: one rank ------------------------------------------------------------------------------

int dtype_size(int t) {
  switch (t) {
    case 0:
    case 1: return 1;  // int8, uint8
    case 2:
    case 3:
    case 6: return 4;  // int32, uint32, float32
    case 4:
    case 5:
    case 8: return 8;  // int64, uint64, float64
    case 7:
    case 9: return 2;  // float16, bfloat16
    default: return 0;
  }
}
int nccl_version(int* v) {
  *v = 22809;
  return 0;
}
int nccl_unique_id(WlNcclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  return 0;
}
int nccl_init(void** comm, int nranks, WlNcclUniqueId, int rank) {
  if (nranks != 1 || rank != 0) return 4;  // ncclInvalidArgument: the fake has one rank
  *comm = new int(0);
  return 0;
}
int nccl_destroy(void* comm) {
  delete static_cast<int*>(comm);
  return 0;
}
int nccl_copy(const void* send, void* recv, size_t count, int dtype, void* stream) {
  int size = dtype_size(dtype);
  if (size == 0 || !stream) return 4;
  if (send == recv || count == 0) return 0;
  std::byte* d = S().device_bytes(recv, count * static_cast<size_t>(size));
  const std::byte* s = S().device_bytes(send, count * static_cast<size_t>(size));
  if (!d || !s) return 4;
  std::memcpy(d, s, count * static_cast<size_t>(size));
  return 0;
}
int nccl_all_gather(const void* send, void* recv, size_t count, int dtype, void*, void* stream) {
  return nccl_copy(send, recv, count, dtype, stream);
}
int nccl_broadcast(const void* send, void* recv, size_t count, int dtype, int root, void*, void* stream) {
  if (root != 0) return 4;
  return nccl_copy(send, recv, count, dtype, stream);
}
const char* nccl_error(int r) { return r == 0 ? "no error" : "invalid argument (fake NCCL has one rank)"; }

int nccl_count(void* comm, int* n) {
  if (!comm) return 4;
  *n = 1;
  return 0;
}
int nccl_user_rank(void* comm, int* r) {
  if (!comm) return 4;
  *r = 0;
  return 0;
}
int nccl_abort(void* comm) { return nccl_destroy(comm); }
int nccl_async_error(void*, int* result) {
  *result = 0;
  return 0;
}

const WlNccl kNccl = {nccl_version, nccl_unique_id, nccl_init,      nccl_destroy, nccl_all_gather, nccl_broadcast,
                      nccl_error,   nccl_count,     nccl_user_rank, nccl_abort,   nccl_async_error};

}  // namespace

Api make_api(const Options& o) {
  {
    std::lock_guard lk(g_state_mu);
    // Earlier states stay allocated until exit: a table they filled may still
    // be in use by a backend being torn down. Tests create a few dozen.
    // (Never destroyed: the backend's threads may outlive static destruction.)
    static auto* states = new std::vector<std::unique_ptr<State>>();
    states->push_back(std::make_unique<State>());
    g_state = states->back().get();
    g_state->o = o;
    g_state->used.assign(static_cast<size_t>(std::max(o.devices, 1)), 0);
  }
  Api a;
  a.kind = BackendKind::kFake;
  a.name = "fake (host memory)";
  a.devices = std::max(o.devices, 0);
  if (a.devices == 0) a.reason = "no CUDA device (fake backend with 0 devices)";
  a.rt = WlCudaRuntime{get_device_count,  set_device,         get_device,      device_malloc,   device_free,
                       host_alloc,        free_host,          memcpy_sync,     memcpy_async,    stream_create,
                       stream_destroy,    stream_synchronize, event_create,    event_destroy,   event_record,
                       event_synchronize, event_query,        mem_get_info,    runtime_version, last_error,
                       error_string,      host_register,      host_unregister, device_attribute};
  a.kernels_loaded = true;
  if (o.kernels)
    a.fill_dummy = fill_dummy;
  else
    a.kernels_reason = "the CUDA kernels (libweightlift_cuda.so) are not installed (fake backend)";
  if (o.cufile) a.fake_cufile = &kCuFile;
  if (!o.machine_platform)
    a.probe_platform = [platform = o.platform](int fd) {
      g_stats.platform_probes++;
      GdsPlatform p = platform;
      struct stat st {};
      if (::fstat(fd, &st) == 0) p.fs_id = static_cast<uint64_t>(st.st_dev);
      return p;
    };
  if (o.nccl) a.fake_nccl = &kNccl;
  return a;
}

void install(const Options& o) {
  replace_backend(nullptr);  // tear the old one down first (its threads use the old state)
  Stats& s = g_stats;
  s.async_copies = 0, s.async_bytes = 0, s.pageable_async_copies = 0, s.slot_overwrites = 0, s.sync_copies = 0;
  s.cufile_reads = 0, s.cufile_bytes = 0, s.cufile_handles = 0, s.cufile_buffers = 0;
  s.cufile_opens = 0, s.platform_probes = 0;
  s.device_allocs = 0, s.pinned_allocs = 0, s.device_live = 0, s.device_peak = 0, s.pinned_live = 0;
  s.host_registers = 0, s.host_unregisters = 0, s.registered_async_copies = 0, s.host_registered_live = 0;
  reset_ring_options();
  replace_backend(std::make_unique<Backend>(make_api(o)));
}

void uninstall() {
  replace_backend(nullptr);
  reset_ring_options();
  replace_backend(std::make_unique<Backend>(detect_cuda()));
}

Stats& stats() { return g_stats; }

}  // namespace wl::gpu::fake

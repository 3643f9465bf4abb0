// nccl_collective(): a caller's NCCL communicator as a Collective. NCCL and
// the CUDA runtime are reached through a minimal function table filled with
// dlopen (preferring the copies the process already loaded, e.g. torch's),
// so nothing links them and machines without a GPU are unaffected.
// TODO(gpu): this table moves onto the one CUDA/cuFile/NCCL table of src/gpu/
// when that lands; the Collective below stays as it is.
#include <dlfcn.h>

#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "weightlift/collective.h"

namespace wl {

namespace {

// The ABI subset used here (nccl.h, cuda_runtime_api.h): stable across
// NCCL 2.x and CUDA 11-13.
using ncclComm_t = void*;
using cudaStream_t = void*;
using ncclResult_t = int;
using cudaError_t = int;
constexpr int kNcclUint8 = 1;          // ncclUint8
constexpr ncclResult_t kNcclInProgress = 7;
constexpr cudaError_t kCudaNotReady = 600;  // cudaErrorNotReady
constexpr int kCudaMemcpyDefault = 4;
constexpr unsigned kCudaStreamNonBlocking = 1;

struct Api {
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*CommCount)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  cudaError_t (*StreamCreateWithFlags)(cudaStream_t*, unsigned) = nullptr;
  cudaError_t (*StreamDestroy)(cudaStream_t) = nullptr;
  cudaError_t (*StreamQuery)(cudaStream_t) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  const char* (*GetErrorStringCuda)(cudaError_t) = nullptr;
  std::string reason;  // empty when usable
};

void* open_first(std::initializer_list<const char*> names, std::string& errors) {
  for (const char* n : names) {
    if (void* h = ::dlopen(n, RTLD_NOW | RTLD_NOLOAD)) return h;  // already loaded (torch's)
  }
  for (const char* n : names) {
    if (void* h = ::dlopen(n, RTLD_NOW | RTLD_LOCAL)) return h;
    if (const char* e = ::dlerror()) errors += fmt::format("\n  {}: {}", n, e);
  }
  return nullptr;
}

template <class F>
bool sym(void* h, const char* name, F& out, std::string& missing) {
  out = reinterpret_cast<F>(::dlsym(h, name));
  if (!out) missing += std::string(" ") + name;
  return out != nullptr;
}

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string errors;
    void* nccl = open_first({"libnccl.so.2", "libnccl.so"}, errors);
    void* cudart = open_first({"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}, errors);
    if (!nccl || !cudart) {
      a.reason = fmt::format("NCCL is not available: {} cannot be loaded{}", !nccl ? "libnccl.so.2" : "libcudart.so",
                             errors);
      return;
    }
    std::string missing;
    sym(nccl, "ncclAllGather", a.AllGather, missing);
    sym(nccl, "ncclBroadcast", a.Broadcast, missing);
    sym(nccl, "ncclCommCount", a.CommCount, missing);
    sym(nccl, "ncclCommUserRank", a.CommUserRank, missing);
    sym(nccl, "ncclCommAbort", a.CommAbort, missing);
    sym(nccl, "ncclCommGetAsyncError", a.CommGetAsyncError, missing);
    sym(nccl, "ncclGetErrorString", a.GetErrorString, missing);
    sym(cudart, "cudaSetDevice", a.SetDevice, missing);
    sym(cudart, "cudaStreamCreateWithFlags", a.StreamCreateWithFlags, missing);
    sym(cudart, "cudaStreamDestroy", a.StreamDestroy, missing);
    sym(cudart, "cudaStreamQuery", a.StreamQuery, missing);
    sym(cudart, "cudaMalloc", a.Malloc, missing);
    sym(cudart, "cudaFree", a.Free, missing);
    sym(cudart, "cudaMemcpyAsync", a.MemcpyAsync, missing);
    sym(cudart, "cudaGetErrorString", a.GetErrorStringCuda, missing);
    if (!missing.empty()) a.reason = "NCCL or the CUDA runtime lacks" + missing;
  });
  return a;
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const Api& a, ncclComm_t comm, cudaStream_t stream, bool own_stream, int device, int rank, int size,
                 std::chrono::milliseconds timeout)
      : a_(a), comm_(comm), stream_(stream), own_stream_(own_stream), device_(device), rank_(rank), size_(size),
        timeout_(timeout) {}
  ~NcclCollective() override {
    if (own_stream_) (void)a_.StreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device{DeviceKind::kCuda, device_}; }

  Status all_gather(std::byte* buf, uint64_t block) override {
    WL_RETURN_IF_ERROR(usable());
    const std::byte* mine = buf + static_cast<uint64_t>(rank_) * block;  // in place
    WL_RETURN_IF_ERROR(nccl(a_.AllGather(mine, buf, block, kNcclUint8, comm_, stream_), "ncclAllGather"));
    return wait("ncclAllGather");
  }
  Status broadcast(std::byte* buf, uint64_t n, int root) override {
    WL_RETURN_IF_ERROR(usable());
    WL_RETURN_IF_ERROR(nccl(a_.Broadcast(buf, buf, n, kNcclUint8, root, comm_, stream_), "ncclBroadcast"));
    return wait("ncclBroadcast");
  }
  // Through device scratch memory: the lengths, then every string padded to the longest.
  Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    const auto w = static_cast<uint64_t>(size_);
    WL_ASSIGN_OR_RETURN(auto lens_dev, allocate(w * 8));
    std::vector<uint64_t> lens(size_);
    lens[static_cast<size_t>(rank_)] = mine.size();
    WL_RETURN_IF_ERROR(copy(lens_dev.get() + static_cast<uint64_t>(rank_) * 8, device(),
                            reinterpret_cast<const std::byte*>(&lens[static_cast<size_t>(rank_)]), kCpu, 8));
    WL_RETURN_IF_ERROR(all_gather(lens_dev.get(), 8));
    WL_RETURN_IF_ERROR(copy(reinterpret_cast<std::byte*>(lens.data()), kCpu, lens_dev.get(), device(), w * 8));
    uint64_t longest = 1;
    for (uint64_t n : lens) {
      if (n > (uint64_t{64} << 20)) return Status::Aborted(fmt::format("a rank sent a {}-byte control message", n));
      longest = std::max(longest, n);
    }
    WL_ASSIGN_OR_RETURN(auto all_dev, allocate(w * longest));
    WL_RETURN_IF_ERROR(copy(all_dev.get() + static_cast<uint64_t>(rank_) * longest, device(),
                            reinterpret_cast<const std::byte*>(mine.data()), kCpu, mine.size()));
    WL_RETURN_IF_ERROR(all_gather(all_dev.get(), longest));
    std::string all(static_cast<size_t>(w * longest), '\0');
    WL_RETURN_IF_ERROR(copy(reinterpret_cast<std::byte*>(all.data()), kCpu, all_dev.get(), device(), w * longest));
    std::vector<std::string> out;
    for (uint64_t k = 0; k < w; ++k) out.push_back(all.substr(static_cast<size_t>(k * longest), static_cast<size_t>(lens[k])));
    return out;
  }
  void abort(const Status& why) override {
    (void)why;
    if (!aborted_) (void)a_.CommAbort(comm_);
    aborted_ = true;
  }

  Result<std::shared_ptr<std::byte>> allocate(uint64_t n) override {
    WL_RETURN_IF_ERROR(cuda(a_.SetDevice(device_), "cudaSetDevice"));
    void* p = nullptr;
    WL_RETURN_IF_ERROR(cuda(a_.Malloc(&p, static_cast<size_t>(std::max<uint64_t>(n, 1))), "cudaMalloc"));
    const Api* a = &a_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [a](std::byte* q) { (void)a->Free(q); });
  }
  Status copy(std::byte* dst, Device, const std::byte* src, Device, uint64_t n) override {
    if (n == 0) return Status();
    WL_RETURN_IF_ERROR(cuda(a_.SetDevice(device_), "cudaSetDevice"));
    WL_RETURN_IF_ERROR(cuda(a_.MemcpyAsync(dst, src, static_cast<size_t>(n), kCudaMemcpyDefault, stream_), "cudaMemcpyAsync"));
    return wait("cudaMemcpyAsync");
  }

 private:
  Status usable() const {
    if (aborted_) return Status::Aborted("the NCCL communicator was aborted");
    return Status();
  }
  Status nccl(ncclResult_t r, const char* what) {
    if (r == 0 || r == kNcclInProgress) return Status();
    return Status::Aborted(fmt::format("rank {} of {}: {}: {}", rank_, size_, what, a_.GetErrorString(r)));
  }
  Status cuda(cudaError_t e, const char* what) {
    if (e == 0) return Status();
    return Status::IoError(fmt::format("rank {} of {}: {}: {}", rank_, size_, what, a_.GetErrorStringCuda(e)));
  }
  // Polls the stream (and the communicator's asynchronous error) until the
  // queued work is done; past the timeout the communicator is aborted.
  Status wait(const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    while (true) {
      cudaError_t q = a_.StreamQuery(stream_);
      if (q == 0) return Status();
      if (q != kCudaNotReady) return cuda(q, what);
      ncclResult_t async = 0;
      if (a_.CommGetAsyncError(comm_, &async) == 0 && async != 0 && async != kNcclInProgress) {
        abort(Status());
        return nccl(async, what);
      }
      if (std::chrono::steady_clock::now() - t0 > timeout_) {
        abort(Status());
        return Status::Aborted(fmt::format("rank {} of {}: {}: the other ranks did not answer within {} ms", rank_,
                                           size_, what, timeout_.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  const Api& a_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  bool own_stream_;
  int device_, rank_, size_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
};

}  // namespace

Result<std::unique_ptr<Collective>> nccl_collective(void* comm, void* stream, int device,
                                                    std::chrono::milliseconds timeout) {
  if (comm == nullptr) return Status::InvalidArgument("the NCCL communicator is null");
  if (device < 0) return Status::InvalidArgument(fmt::format("CUDA device {} is negative", device));
  const Api& a = api();
  if (!a.reason.empty()) return Status::Unavailable(a.reason);
  if (int e = a.SetDevice(device); e != 0)
    return Status::Unavailable(fmt::format("cudaSetDevice({}): {}", device, a.GetErrorStringCuda(e)));
  int rank = 0, size = 0;
  if (ncclResult_t r = a.CommUserRank(comm, &rank); r != 0)
    return Status::InvalidArgument(fmt::format("ncclCommUserRank: {}", a.GetErrorString(r)));
  if (ncclResult_t r = a.CommCount(comm, &size); r != 0)
    return Status::InvalidArgument(fmt::format("ncclCommCount: {}", a.GetErrorString(r)));
  bool own = stream == nullptr;
  if (own) {
    if (int e = a.StreamCreateWithFlags(&stream, kCudaStreamNonBlocking); e != 0)
      return Status::Unavailable(fmt::format("cudaStreamCreateWithFlags: {}", a.GetErrorStringCuda(e)));
  }
  return std::unique_ptr<Collective>(
      std::make_unique<NcclCollective>(a, comm, stream, own, device, rank, size, timeout));
}

}  // namespace wl

// nccl_collective(): a caller's NCCL communicator as a Collective, through
// the GPU component's one function table (src/gpu/api.h: the CUDA runtime
// and NCCL, dlopen'd, or the host fake in tests), so nothing links them and
// machines without a GPU are unaffected. Every call is queued on one stream
// and waited for by polling an event (and the communicator's asynchronous
// error) against the timeout; past it the communicator is aborted.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "gpu/api.h"
#include "weightlift/collective.h"

namespace wl {

namespace {

constexpr int kNcclUint8 = 1;       // ncclUint8
constexpr int kNcclInProgress = 7;  // ncclInProgress (non-blocking communicators)

class NcclCollective final : public Collective {
 public:
  NcclCollective(const gpu::Api& a, const WlNccl& n, void* comm, void* stream, bool own_stream, void* event, int device,
                 int rank, int size, std::chrono::milliseconds timeout)
      : a_(a), n_(n), comm_(comm), stream_(stream), own_stream_(own_stream), event_(event), device_(device),
        rank_(rank), size_(size), timeout_(timeout) {}
  ~NcclCollective() override {
    (void)a_.rt.eventDestroy(event_);
    if (own_stream_) (void)a_.rt.streamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return Device{DeviceKind::kCuda, device_}; }

  Status all_gather(std::byte* buf, uint64_t block) override {
    WL_RETURN_IF_ERROR(usable());
    const std::byte* mine = buf + static_cast<uint64_t>(rank_) * block;  // in place
    WL_RETURN_IF_ERROR(nccl(n_.allGather(mine, buf, block, kNcclUint8, comm_, stream_), "ncclAllGather"));
    return wait("ncclAllGather");
  }
  Status broadcast(std::byte* buf, uint64_t n, int root) override {
    WL_RETURN_IF_ERROR(usable());
    if (root < 0 || root >= size_)
      return Status::InvalidArgument(fmt::format("broadcast root {} is outside [0, {})", root, size_));
    WL_RETURN_IF_ERROR(nccl(n_.broadcast(buf, buf, n, kNcclUint8, root, comm_, stream_), "ncclBroadcast"));
    return wait("ncclBroadcast");
  }
  // Through device scratch memory: the lengths, then every string padded to the longest.
  Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    const auto w = static_cast<uint64_t>(size_);
    WL_ASSIGN_OR_RETURN(auto lens_dev, allocate(w * 8));
    std::vector<uint64_t> lens(static_cast<size_t>(size_));
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
    for (uint64_t k = 0; k < w; ++k)
      out.push_back(all.substr(static_cast<size_t>(k * longest), static_cast<size_t>(lens[k])));
    return out;
  }
  void abort(const Status& why) override {
    (void)why;
    if (!aborted_) (void)n_.commAbort(comm_);
    aborted_ = true;
  }

  Result<std::shared_ptr<std::byte>> allocate(uint64_t n) override {
    WL_RETURN_IF_ERROR(gpu::set_device(a_, device_));
    void* p = nullptr;
    if (int rc = a_.rt.malloc(&p, static_cast<size_t>(std::max<uint64_t>(n, 1))); rc != 0)
      return gpu::cuda_error(a_, rc, fmt::format("cudaMalloc({} bytes) for the exchange", n));
    const gpu::Api* a = &a_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [a](std::byte* q) { (void)a->rt.free(q); });
  }
  Status copy(std::byte* dst, Device, const std::byte* src, Device, uint64_t n) override {
    if (n == 0) return Status();
    WL_RETURN_IF_ERROR(gpu::set_device(a_, device_));
    if (int rc = a_.rt.memcpyAsync(dst, src, static_cast<size_t>(n), kCudaMemcpyDefault, stream_); rc != 0)
      return gpu::cuda_error(a_, rc, "cudaMemcpyAsync");
    return wait("cudaMemcpyAsync");
  }

 private:
  Status usable() const {
    if (aborted_) return Status::Aborted("the NCCL communicator was aborted");
    return Status();
  }
  Status nccl(int r, const char* what) {
    if (r == 0 || r == kNcclInProgress) return Status();
    return Status::Aborted(fmt::format("rank {} of {}: {}: {}", rank_, size_, what, n_.getErrorString(r)));
  }
  // Polls an event recorded after the queued work until it completes; the
  // communicator's asynchronous error or the timeout aborts it.
  Status wait(const char* what) {
    if (int rc = a_.rt.eventRecord(event_, stream_); rc != 0) return gpu::cuda_error(a_, rc, "cudaEventRecord");
    const auto t0 = std::chrono::steady_clock::now();
    while (true) {
      int q = a_.rt.eventQuery(event_);
      if (q == 0) return Status();
      if (q != kCudaErrorNotReady) return gpu::cuda_error(a_, q, what);
      int async = 0;
      if (n_.commGetAsyncError(comm_, &async) == 0 && async != 0 && async != kNcclInProgress) {
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

  const gpu::Api& a_;
  const WlNccl& n_;
  void* comm_;
  void* stream_;
  bool own_stream_;
  void* event_;
  int device_, rank_, size_;
  std::chrono::milliseconds timeout_;
  bool aborted_ = false;
};

}  // namespace

Result<std::unique_ptr<Collective>> nccl_collective(void* comm, void* stream, int device,
                                                    std::chrono::milliseconds timeout) {
  if (comm == nullptr) return Status::InvalidArgument("the NCCL communicator is null");
  gpu::Backend& b = gpu::backend();
  const gpu::Api& a = b.api();
  WL_RETURN_IF_ERROR(gpu::set_device(a, device));
  const gpu::Nccl& n = b.nccl();
  if (!n.fn) return Status::Unavailable(n.reason);
  int rank = 0, size = 0;
  if (int r = n.fn->commUserRank(comm, &rank); r != 0)
    return Status::InvalidArgument(fmt::format("ncclCommUserRank: {}", n.fn->getErrorString(r)));
  if (int r = n.fn->commCount(comm, &size); r != 0)
    return Status::InvalidArgument(fmt::format("ncclCommCount: {}", n.fn->getErrorString(r)));
  const bool own = stream == nullptr;
  if (own) {
    if (int rc = a.rt.streamCreateWithFlags(&stream, kCudaStreamNonBlocking); rc != 0)
      return gpu::cuda_error(a, rc, "cudaStreamCreateWithFlags");
  }
  void* event = nullptr;
  if (int rc = a.rt.eventCreateWithFlags(&event, kCudaEventDisableTiming); rc != 0) {
    if (own) (void)a.rt.streamDestroy(stream);
    return gpu::cuda_error(a, rc, "cudaEventCreateWithFlags");
  }
  return std::unique_ptr<Collective>(
      std::make_unique<NcclCollective>(a, *n.fn, comm, stream, own, event, device, rank, size, timeout));
}

}  // namespace wl

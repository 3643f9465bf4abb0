// Loads libweightlift_cuda.so on first use (see weightlift/cuda_backend.h).
#include "weightlift/cuda_backend.h"

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "model/cuda_abi.h"

namespace wl::cuda {
namespace {

constexpr const char* kLibName = "libweightlift_cuda.so";

struct Loaded {
  const WlCudaApi* api = nullptr;
  int devices = 0;
  std::string reason;
};

std::string dir_of(const std::string& path) {
  auto pos = path.rfind('/');
  return pos == std::string::npos ? "." : path.substr(0, pos);
}

const Loaded& backend() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("WEIGHTLIFT_CUDA_LIBRARY"); env && *env) candidates.push_back(env);
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(&device_count), &info) && info.dli_fname) {
      std::string dir = dir_of(info.dli_fname);
      candidates.push_back(dir + "/" + kLibName);
      candidates.push_back(dir + "/../lib/" + kLibName);
    }
    candidates.push_back(kLibName);
    std::string errors;
    void* handle = nullptr;
    for (const auto& c : candidates) {
      handle = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      if (const char* e = ::dlerror()) errors += fmt::format("\n  {}: {}", c, e);
    }
    if (!handle) {
      loaded.reason = "the CUDA backend (" + std::string(kLibName) + ") is not installed or cannot be loaded" + errors;
      return;
    }
    // The handle stays open for the life of the process.
    auto get = reinterpret_cast<const WlCudaApi* (*)()>(::dlsym(handle, "wl_cuda_api"));
    const WlCudaApi* api = get ? get() : nullptr;
    if (!api || api->abi_version != kWlCudaAbiVersion) {
      loaded.reason = "the CUDA backend library does not match this weightlift build";
      return;
    }
    loaded.devices = api->device_count();
    if (loaded.devices <= 0) {
      loaded.reason = "no CUDA device (or no NVIDIA driver) is available";
      loaded.devices = 0;
      return;
    }
    loaded.api = api;
  });
  return loaded;
}

Status unavailable() { return Status::Unavailable(backend().reason); }

Status cuda_error(const char* err) { return Status::IoError(std::string("CUDA: ") + err); }

}  // namespace

int device_count() { return backend().devices; }
std::string unavailable_reason() { return backend().reason; }

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, int device) {
  const Loaded& b = backend();
  if (!b.api) return unavailable();
  if (device < 0 || device >= b.devices)
    return Status::InvalidArgument(fmt::format("no CUDA device {} (there are {})", device, b.devices));
  DeviceBuffer out;
  char err[256] = {};
  if (b.api->alloc(device, bytes, &out.ptr_, err, sizeof err) != 0) return cuda_error(err);
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
  if (ptr_ && backend().api) backend().api->release(device_, ptr_);
  ptr_ = nullptr;
  size_ = 0;
}

Status DeviceBuffer::copy_to_host(std::span<std::byte> dst) const {
  if (!backend().api) return unavailable();
  if (dst.size() != size_) return Status::InvalidArgument("host and device buffer sizes differ");
  char err[256] = {};
  if (backend().api->copy_to_host(device_, dst.data(), ptr_, size_, err, sizeof err) != 0) return cuda_error(err);
  return Status();
}

Status DeviceBuffer::copy_from_host(std::span<const std::byte> src) {
  if (!backend().api) return unavailable();
  if (src.size() != size_) return Status::InvalidArgument("host and device buffer sizes differ");
  char err[256] = {};
  if (backend().api->copy_to_device(device_, ptr_, src.data(), size_, err, sizeof err) != 0) return cuda_error(err);
  return Status();
}

}  // namespace wl::cuda

namespace wl::cuda::detail {

Status launch_fill_dummy(int kind, void* device_ptr, uint64_t numel, const dummy::Params& params, int device) {
  const Loaded& b = backend();
  if (!b.api) return unavailable();
  if (device < 0 || device >= b.devices)
    return Status::InvalidArgument(fmt::format("no CUDA device {} (there are {})", device, b.devices));
  char err[256] = {};
  if (b.api->fill_dummy(device, kind, device_ptr, numel, &params, err, sizeof err) != 0) return cuda_error(err);
  return Status();
}

}  // namespace wl::cuda::detail

#include "gpu/gds.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "gpu/gds_platform.h"
#include "io/posix_internal.h"

namespace wl::gpu {

DirectReader::Handle::~Handle() {
  if (handle) fn->handleDeregister(handle);
}

DirectReader::~DirectReader() {
  handles_.clear();
  if (buffers_.empty()) return;  // (never open cuFile just to close nothing)
  if (const WlCuFile* fn = backend_.cufile().fn)
    for (auto& [base, n] : buffers_) (void)fn->bufDeregister(base);
}

Result<std::shared_ptr<DirectReader::Handle>> DirectReader::handle_of(const RandomAccessFile& file) {
  std::lock_guard lk(mu_);
  if (auto it = handles_.find(&file); it != handles_.end()) return it->second;
  const WlCuFile* fn = backend_.cufile().fn;
  if (!fn) return Status::Unavailable("cuFile is not usable: " + backend_.cufile().reason).with_file(file.path());
  int fd = io::posix_fd(file, /*prefer_direct=*/true);
  if (fd < 0) return Status::Unimplemented("not a local file (cuFile reads local files only)").with_file(file.path());
  WlCuFileDescr d{};
  d.type = kCuFileHandleTypeOpaqueFd;
  d.handle.fd = fd;
  auto h = std::make_shared<Handle>();
  h->fn = fn;
  h->file = file.weak_from_this().lock();
  if (!h->file) return Status::Internal("a file not held by a shared_ptr").with_file(file.path());
  WlCuFileError e = fn->handleRegister(&h->handle, &d);
  if (e.err != 0) {
    h->handle = nullptr;
    return Status::Unimplemented(
               fmt::format(
                   "cuFileHandleRegister failed (cuFile error {}): the filesystem does not support GPUDirect Storage",
                   e.err))
        .with_file(file.path());
  }
  if (order_.size() >= kMaxHandles) {  // the oldest goes; a read still using it holds its own reference
    handles_.erase(order_.front());
    order_.erase(order_.begin());
  }
  handles_[&file] = h;
  order_.push_back(&file);
  return h;
}

std::string DirectReader::verdict(const RandomAccessFile& probe) {
  const int fd = io::posix_fd(probe, /*prefer_direct=*/false);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return "not a local file (cuFile reads local files only)";
  return backend_.gds_verdict(device_, static_cast<uint64_t>(st.st_dev), [&]() -> std::string {
    const auto t0 = std::chrono::steady_clock::now();
    const Api& api = backend_.api();
    GdsPlatform p = api.probe_platform ? api.probe_platform(fd) : probe_platform(fd);
    std::string why = platform_refusal(p);
    add_cost(&ProcessCosts::gds_probe_ms, ms_since(t0));
    if (!why.empty()) return why + " (cuFile not opened)";
    const CuFile& c = backend_.cufile();
    if (!c.fn) return "cuFile is not usable: " + c.reason;
    if (!c.fn->driverGetProperties) return {};  // an old cuFile: the file's registration decides
    WlCuFileDrvProps props{};
    if (WlCuFileError e = c.fn->driverGetProperties(&props); e.err != 0)
      return fmt::format("cuFileDriverGetProperties failed (cuFile error {})", e.err);
    return properties_refusal(props, p);
  });
}

Status DirectReader::support(const RandomAccessFile& probe, Toggle policy, bool trust_cufile) {
  if (policy == Toggle::kAuto && !trust_cufile) {
    if (std::string why = verdict(probe); !why.empty()) return Status::Unimplemented(why).with_file(probe.path());
  } else if (!backend_.cufile().fn) {
    return Status::Unavailable("cuFile is not usable: " + backend_.cufile().reason);
  }
  return handle_of(probe).status();
}

void DirectReader::register_buffer(const std::byte* base, uint64_t n) {
  const WlCuFile* fn = backend_.cufile().fn;
  if (!fn || n == 0) return;
  if (fn->bufRegister(base, static_cast<size_t>(n), 0).err == 0) {
    std::lock_guard lk(mu_);
    buffers_.emplace_back(base, n);
  }
}

Status DirectReader::read(const RandomAccessFile& file, uint64_t offset, std::byte* dst, uint64_t n) {
  WL_ASSIGN_OR_RETURN(auto h, handle_of(file));
  WL_RETURN_IF_ERROR(set_device(backend_.api(), device_));
  // A registered buffer is addressed as (its base, offset into it).
  const std::byte* base = dst;
  {
    std::lock_guard lk(mu_);
    for (auto& [b, len] : buffers_)
      if (dst >= b && static_cast<uint64_t>(dst - b) < len) base = b;
  }
  uint64_t done = 0;
  while (done < n) {
    const uint64_t want = std::min<uint64_t>(n - done, uint64_t{1} << 30);
    ssize_t r = h->fn->read(h->handle, const_cast<std::byte*>(base), static_cast<size_t>(want),
                            static_cast<off_t>(offset + done), static_cast<off_t>(dst + done - base));
    if (r < 0)
      return Status::IoError(
                 fmt::format("cuFileRead of {} bytes at offset {} failed (cuFile error {})", want, offset + done, -r))
          .with_file(file.path());
    if (r == 0)
      return Status::OutOfRange(fmt::format("cuFileRead at offset {} hit the end of the file", offset + done))
          .with_file(file.path());
    done += static_cast<uint64_t>(r);
  }
  return Status();
}

}  // namespace wl::gpu

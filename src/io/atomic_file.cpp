#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "weightlift/io.h"

namespace wl {

namespace {
std::string dir_of(const std::string& path) {
  auto pos = path.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}
}  // namespace

Result<AtomicFile> AtomicFile::create(const std::string& final_path, unsigned mode) {
  if (final_path.empty()) return Status::InvalidArgument("empty output path");
  std::string tmpl = final_path + ".tmp.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = ::mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "cannot create temporary file").with_file(final_path);
  // mkostemp creates 0600; honour the requested mode (minus umask) as open() would.
  mode_t mask = ::umask(0);
  ::umask(mask);
  (void)::fchmod(fd, static_cast<mode_t>(mode) & ~mask);
  return AtomicFile(final_path, std::string(buf.data()), fd);
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : final_path_(std::move(o.final_path_)),
      temp_path_(std::move(o.temp_path_)),
      fd_(std::exchange(o.fd_, -1)),
      offset_(o.offset_),
      committed_(o.committed_) {
  o.committed_ = true;  // the moved-from object owns nothing to clean up
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_path_.empty()) ::unlink(temp_path_.c_str());
}

Status AtomicFile::write_at(uint64_t offset, std::span<const std::byte> data) {
  if (fd_ < 0) return Status::Internal("write after commit").with_file(final_path_);
  const std::byte* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write failed").with_file(final_path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status();
}

Status AtomicFile::append(std::span<const std::byte> data) {
  WL_RETURN_IF_ERROR(write_at(offset_, data));
  offset_ += data.size();
  return Status();
}

Status AtomicFile::resize(uint64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    return Status::FromErrno(errno, "cannot resize").with_file(final_path_);
  return Status();
}

Status AtomicFile::commit() {
  if (fd_ < 0) return Status::Internal("commit twice").with_file(final_path_);
  if (::fsync(fd_) != 0) return Status::FromErrno(errno, "fsync failed").with_file(final_path_);
  if (::close(std::exchange(fd_, -1)) != 0) return Status::FromErrno(errno, "close failed").with_file(final_path_);
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
    return Status::FromErrno(errno, "cannot rename temporary file into place").with_file(final_path_);
  committed_ = true;
  int dfd = ::open(dir_of(final_path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status();
}

}  // namespace wl

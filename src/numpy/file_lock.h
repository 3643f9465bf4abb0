// A plain flock()-based cross-process lock (private). Stands in for the
// model-utils get_lock() until that lands; same contract: exclusive, held
// until destruction, released by the kernel if the process dies.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "weightlift/status.h"

namespace wl {

class FileLock {
 public:
  static Result<FileLock> acquire(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno(errno, "cannot open lock file").with_file(path);
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return Status::FromErrno(err, "cannot lock").with_file(path);
    }
    return FileLock(fd);
  }
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace wl

// The model lock (flock on a shared 0666 file) and the atomic writer.
#include "weightlift/lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <thread>

#include "weightlift/hash.h"
#include "weightlift/io.h"

namespace wl {
namespace {

bool usable_dir(const std::string& dir) {
  struct stat st{};
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(dir.c_str(), W_OK | X_OK) == 0;
}

std::string absolute(const std::string& dir) {
  std::error_code ec;
  auto p = std::filesystem::absolute(dir, ec);
  if (ec) return dir;
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::string system_temp_dir() {
  for (const char* var : {"TMPDIR", "TEMP", "TMP"}) {
    const char* v = std::getenv(var);
    if (v && *v && usable_dir(v)) return absolute(v);
  }
  for (const char* d : {"/tmp", "/var/tmp", "/usr/tmp"})
    if (usable_dir(d)) return d;
  std::error_code ec;
  auto cwd = std::filesystem::current_path(ec);
  return ec ? std::string(".") : cwd.string();
}

std::string lock_file_path(std::string_view model_name_or_path, std::string_view cache_dir) {
  std::string dir = cache_dir.empty() ? system_temp_dir() : std::string(cache_dir);
  std::string name(model_name_or_path);
  for (char& c : name)
    if (c == '/') c = '-';
  std::string file = sha256_hex(name) + name + ".lock";
  if (!dir.empty() && dir.back() != '/') dir += '/';
  return dir + file;
}

CrossProcessLock get_lock(std::string_view model_name_or_path, std::string_view cache_dir) {
  return CrossProcessLock(lock_file_path(model_name_or_path, cache_dir));
}

CrossProcessLock::CrossProcessLock(CrossProcessLock&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), count_(std::exchange(o.count_, 0)) {}

CrossProcessLock::~CrossProcessLock() {
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
}

Status CrossProcessLock::open_file() {
  if (fd_ >= 0) return Status();
  if (Status s = Env::Default()->create_dirs(parent_dir(path_)); !s.ok())
    return Status(s.code(), "cannot create the lock directory: " + s.message()).with_file(parent_dir(path_));
  int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return Status::FromErrno(errno, "cannot open the lock file").with_file(path_);
  // The umask would narrow 0666; widen it again so other users can lock too.
  // Fails with EPERM when another user owns the file, which is fine.
  (void)::fchmod(fd, 0666);
  fd_ = fd;
  return Status();
}

Result<bool> CrossProcessLock::try_acquire() {
  if (count_ > 0) {
    ++count_;
    return true;
  }
  WL_RETURN_IF_ERROR(open_file());
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    count_ = 1;
    return true;
  }
  int err = errno;
  if (err == EWOULDBLOCK || err == EINTR) return false;
  ::close(std::exchange(fd_, -1));
  return Status::FromErrno(err, "cannot lock").with_file(path_);
}

Status CrossProcessLock::acquire(double timeout_s, double poll_s) {
  if (count_ > 0) {
    ++count_;
    return Status();
  }
  WL_RETURN_IF_ERROR(open_file());
  if (timeout_s < 0) {
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(std::exchange(fd_, -1));
      return Status::FromErrno(err, "cannot lock").with_file(path_);
    }
    count_ = 1;
    return Status();
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    WL_ASSIGN_OR_RETURN(bool got, try_acquire());
    if (got) return Status();
    if (std::chrono::steady_clock::now() >= deadline) {
      ::close(std::exchange(fd_, -1));
      return Status::Unavailable("timed out waiting for the lock").with_file(path_);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s > 0 ? poll_s : 0.05));
  }
}

void CrossProcessLock::release() {
  if (count_ == 0) return;
  if (--count_ > 0) return;
  if (fd_ >= 0) {
    ::flock(fd_, LOCK_UN);
    ::close(std::exchange(fd_, -1));
  }
}

Result<LockGuard> LockGuard::make(CrossProcessLock& lock, double timeout_s) {
  WL_RETURN_IF_ERROR(lock.acquire(timeout_s));
  return LockGuard(&lock);
}

Status atomic_write(const std::string& path, const std::function<Status(AtomicWriter&)>& fill, unsigned mode) {
  WL_ASSIGN_OR_RETURN(AtomicFile file, AtomicFile::create(path, mode));
  Status st;
  try {
    AtomicWriter writer(file);
    st = fill(writer);
  } catch (const std::exception& e) {
    st = Status::Internal(std::string("atomic write aborted by an exception: ") + e.what());
  } catch (...) {
    st = Status::Internal("atomic write aborted by an exception");
  }
  if (!st.ok()) return std::move(st).with_file(path);  // ~AtomicFile removes the temporary
  return file.commit();
}

Status atomic_write_bytes(const std::string& path, std::span<const std::byte> data, unsigned mode) {
  return atomic_write(path, [&](AtomicWriter& w) { return w.write(data); }, mode);
}

}  // namespace wl

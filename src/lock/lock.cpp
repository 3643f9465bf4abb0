// The model lock (flock on a shared 0666 file) and the atomic writer.
#include "weightlift/lock.h"

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
  struct stat st {};
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
    : path_(std::move(o.path_)), env_(o.env_), file_(std::move(o.file_)), count_(std::exchange(o.count_, 0)) {}

CrossProcessLock::~CrossProcessLock() {
  if (file_) file_->unlock();
}

Status CrossProcessLock::open_file() {
  if (file_) return Status();
  if (Status s = env_->create_dirs(parent_dir(path_)); !s.ok())
    return Status(s.code(), "cannot create the lock directory: " + s.message()).with_file(parent_dir(path_));
  WL_ASSIGN_OR_RETURN(file_, env_->open_lock(path_, 0666));
  return Status();
}

Result<bool> CrossProcessLock::try_acquire() {
  if (count_ > 0) {
    ++count_;
    return true;
  }
  WL_RETURN_IF_ERROR(open_file());
  auto got = file_->try_lock();
  if (!got.ok())
    file_.reset();
  else if (*got)
    count_ = 1;
  return got;
}

Status CrossProcessLock::acquire(double timeout_s, double poll_s) {
  if (count_ > 0) {
    ++count_;
    return Status();
  }
  WL_RETURN_IF_ERROR(open_file());
  if (timeout_s < 0) {
    if (Status s = file_->lock(); !s.ok()) {
      file_.reset();
      return s;
    }
    count_ = 1;
    return Status();
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    WL_ASSIGN_OR_RETURN(bool got, try_acquire());
    if (got) return Status();
    if (std::chrono::steady_clock::now() >= deadline) {
      file_.reset();
      return Status::Unavailable("timed out waiting for the lock").with_file(path_);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(poll_s > 0 ? poll_s : 0.05));
  }
}

void CrossProcessLock::release() {
  if (count_ == 0) return;
  if (--count_ > 0) return;
  if (file_) {
    file_->unlock();
    file_.reset();
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
  return atomic_write(
      path, [&](AtomicWriter& w) { return w.write(data); }, mode);
}

}  // namespace wl

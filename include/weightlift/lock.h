// weightlift/lock.h: the cross-process model lock and the atomic writer
// (vLLM weight_utils.get_lock / atomic_writer).
//
// Locks are advisory flock(2) locks on a file named
//   sha256(name).hex + name + ".lock",  name = model with every '/' -> '-',
// kept in `cache_dir` or, when that is empty, the system temporary directory
// (TMPDIR, TEMP, TMP, /tmp, /var/tmp, /usr/tmp, the working directory: the
// first writable one). The file gets mode 0666 whatever the umask, so users
// sharing a cache share the lock. flock locks belong to an open file
// description: two CrossProcessLock objects exclude each other even in one process,
// so threads and processes are treated alike. Lock files are never deleted
// (deleting one while another process waits on it would break exclusion).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl {

// The system temporary directory, as Python's tempfile.gettempdir() picks it.
std::string system_temp_dir();

// Where the lock of `model_name_or_path` lives (no file is created).
std::string lock_file_path(std::string_view model_name_or_path, std::string_view cache_dir = {});

// A re-entrant exclusive lock on one lock file, taken through `env`
// (Env::open_lock). Not thread-safe per object: share a path, not an object,
// between threads. Move-only; the destructor releases a held lock.
class CrossProcessLock {
 public:
  explicit CrossProcessLock(std::string path, Env* env = Env::Default()) : path_(std::move(path)), env_(env) {}
  CrossProcessLock(CrossProcessLock&& o) noexcept;
  CrossProcessLock& operator=(CrossProcessLock&&) = delete;
  CrossProcessLock(const CrossProcessLock&) = delete;
  ~CrossProcessLock();

  // Blocks until the lock is held. timeout_s < 0 waits forever; otherwise
  // polls every `poll_s` seconds and fails with kUnavailable after timeout_s.
  // Creates the lock file's directory and the file (mode 0666) as needed.
  // Re-entrant: a second acquire() on a holding object only counts.
  Status acquire(double timeout_s = -1, double poll_s = 0.05);
  // One attempt, never blocks: true when the lock is now held.
  Result<bool> try_acquire();
  // Undoes one acquire(); the lock is released when the count reaches 0.
  void release();
  bool is_locked() const { return count_ > 0; }
  const std::string& path() const { return path_; }

 private:
  Status open_file();
  std::string path_;
  Env* env_;
  std::unique_ptr<FileLock> file_;  // open while the lock is wanted
  int count_ = 0;
};

// get_lock(): the lock object for a model (not yet acquired).
CrossProcessLock get_lock(std::string_view model_name_or_path, std::string_view cache_dir = {});

// RAII: acquires in make(), releases in the destructor.
class LockGuard {
 public:
  static Result<LockGuard> make(CrossProcessLock& lock, double timeout_s = -1);
  LockGuard(LockGuard&& o) noexcept : lock_(std::exchange(o.lock_, nullptr)) {}
  LockGuard& operator=(LockGuard&&) = delete;
  ~LockGuard() {
    if (lock_) lock_->release();
  }

 private:
  explicit LockGuard(CrossProcessLock* lock) : lock_(lock) {}
  CrossProcessLock* lock_;
};

// The writer handed to atomic_write's callback: bytes go to a temporary file
// in the target's directory.
class AtomicWriter {
 public:
  explicit AtomicWriter(AtomicFile& file) : file_(file) {}
  Status write(std::span<const std::byte> data) { return file_.append(data); }
  Status write(std::string_view text) { return file_.append(text); }
  const std::string& temp_path() const { return file_.temp_path(); }

 private:
  AtomicFile& file_;
};

// atomic_writer(): runs `fill` on a temporary file next to `path` and, only
// when it returns OK, renames the file over `path`. On an error status, an
// exception thrown by `fill`, or a failed write/rename, `path` is left exactly
// as it was and the temporary is removed; the error is returned (an exception
// becomes kInternal). Text and binary content are both plain bytes (POSIX text
// mode does not translate). `mode` is the new file's permission before the
// umask; 0600 matches the reference (mkstemp's mode survives os.replace).
Status atomic_write(const std::string& path, const std::function<Status(AtomicWriter&)>& fill, unsigned mode = 0600);
Status atomic_write_bytes(const std::string& path, std::span<const std::byte> data, unsigned mode = 0600);
inline Status atomic_write_text(const std::string& path, std::string_view text, unsigned mode = 0600) {
  return atomic_write_bytes(path, std::as_bytes(std::span(text.data(), text.size())), mode);
}

}  // namespace wl

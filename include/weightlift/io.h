// weightlift/io.h: the I/O seam (leveldb's Env, rocksdb's read contract).
//
// All file access of the library goes through Env, so tests can count or
// break reads (see FaultInjectionEnv in tests/) and other backends (object
// storage, HTTP) can stand in for local files.
//
// The read contract: RandomAccessFile::read_at() fills the whole buffer or
// returns an error. Short reads and EINTR are retried inside; a range past
// the end of the file is kOutOfRange. No caller ever sees a partial read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/status.h"

namespace wl {

enum class Advice { kNormal, kSequential, kRandom, kWillNeed, kDontNeed };

enum class FileMode {
  kMmap,    // the file is mapped; view() returns zero-copy spans
  kPread,   // buffered pread()
  kDirect,  // pread() with O_DIRECT, falling back to buffered where refused
};

struct OpenOptions {
  FileMode mode = FileMode::kMmap;
  bool populate = false;  // kMmap: pre-fault the mapping (MAP_POPULATE)
};

// An open, immutable file. Thread-safe: every method may be called from many
// threads at once. Created only through Env::open(); held by shared_ptr so
// that views can keep it alive.
class RandomAccessFile : public std::enable_shared_from_this<RandomAccessFile> {
 public:
  virtual ~RandomAccessFile() = default;

  virtual const std::string& path() const = 0;
  // Size at open time, in bytes.
  virtual uint64_t size() const = 0;

  // Reads exactly dst.size() bytes starting at `offset` into dst, or fails.
  // Errors name the file. Any alignment of dst/offset is accepted.
  virtual Status read_at(uint64_t offset, std::span<std::byte> dst) const = 0;

  // Zero-copy bytes [offset, offset+n) when the file is memory-mapped;
  // kUnimplemented otherwise. The span lives as long as this object.
  virtual Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const;

  // Alignment that makes reads fastest (4096 for O_DIRECT files, else 1).
  virtual size_t alignment() const { return 1; }

  // A hint (posix_fadvise / madvise); failures are ignored.
  virtual void advise(uint64_t offset, uint64_t n, Advice advice) const;

  // The open file descriptor, or -1 when there is none (a fake in tests).
  virtual int fd() const { return -1; }
};

struct DirEntry {
  std::string name;  // base name
  bool is_dir = false;
  bool is_symlink = false;
};

// The environment: opening, listing and writing files.
// Default() is a process-wide POSIX implementation; thread-safe.
class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  virtual Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options = {}) = 0;
  virtual Result<uint64_t> file_size(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual bool is_directory(const std::string& path) = 0;
  // Entries of a directory, sorted by name.
  virtual Result<std::vector<DirEntry>> list_dir(const std::string& path) = 0;
};

// Forwards everything to a target Env: subclass to intercept some calls.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* target) : target_(target) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    return target_->open(path, o);
  }
  Result<uint64_t> file_size(const std::string& path) override { return target_->file_size(path); }
  bool exists(const std::string& path) override { return target_->exists(path); }
  bool is_directory(const std::string& path) override { return target_->is_directory(path); }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override { return target_->list_dir(path); }
  Env* target() const { return target_; }

 private:
  Env* target_;
};

// Writes a file atomically: bytes go to a temporary file in the same
// directory ("<name>.tmp.XXXXXX"); commit() fsyncs it, renames it over the
// final name and fsyncs the directory. If commit() is not reached (error,
// exception, crash) the final name is untouched and the temporary is removed
// by the destructor. Not thread-safe. Move-only.
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& final_path, unsigned mode = 0644);
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  // Appends all bytes or fails (ENOSPC is kIoError naming the file).
  Status append(std::span<const std::byte> data);
  Status append(std::string_view text) { return append(std::as_bytes(std::span(text.data(), text.size()))); }
  // Writes at an offset (for writers that fill a file out of order).
  Status write_at(uint64_t offset, std::span<const std::byte> data);
  // Sets the size up front (ftruncate) so write_at() can fill it in parallel.
  Status resize(uint64_t size);
  Status commit();
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }
  int fd() const { return fd_; }

 private:
  AtomicFile(std::string final_path, std::string temp_path, int fd)
      : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)), fd_(fd) {}
  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

// Convenience: the whole file, via Env::Default().
Result<std::string> read_file_to_string(const std::string& path, uint64_t max_bytes = uint64_t{1} << 30);
Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace wl

// FaultInjectionEnv: an Env (built on wl::EnvWrapper) whose files fail the
// way disks and network filesystems do, for the fault_*_test.cpp tests.
//
// Faults are armed per path (a path "matches" a rule when it ends with the
// rule's suffix; an empty suffix matches every file). Every call is counted,
// so the limits tests can assert on operation counts. Thread-safe: counters
// are atomics and rules are set before the code under test runs.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weightlift/io.h"
#include "weightlift/safetensors.h"

namespace wl::testing {

struct FileFault {
  std::string path_suffix;  // which files ("" = all)
  // EIO for any read that touches a byte at or after this offset.
  std::optional<uint64_t> eio_from_offset;
  // The first `eio_after_reads` reads succeed, every later one fails with EIO.
  std::optional<uint64_t> eio_after_reads;
  // The file shrinks to this many bytes after `truncate_after_reads` reads:
  // later reads past it fail as a real pread does (end of file).
  std::optional<uint64_t> truncate_to;
  uint64_t truncate_after_reads = 0;
  // After `change_after_reads` reads every byte read comes back XOR 0xFF (the
  // file was rewritten in place underneath the reader).
  std::optional<uint64_t> change_after_reads;
  // open() fails with this errno.
  int open_errno = 0;
  // views are refused (as for a file that cannot be mapped), so readers take
  // the read_at() path where the faults above apply.
  bool no_views = true;
};

// Faults of the write side, armed for paths containing `path_part` ("" = all).
struct WriteFault {
  std::string path_part;
  int create_errno = 0;                        // new_writable() fails with this errno
  std::optional<uint64_t> enospc_after_bytes;  // writes fail with ENOSPC once this many bytes were written (all files)
  int rename_errno = 0;                        // rename() onto a matching path fails with this errno
  int symlink_errno = 0;                       // symlink() at a matching path fails with this errno
  int lock_errno = 0;                          // open_lock() at a matching path fails with this errno
};

struct FaultCounters {
  std::atomic<uint64_t> opens{0}, reads{0}, bytes_read{0}, views{0}, exists{0}, lists{0}, sizes{0}, is_dirs{0};
  std::atomic<uint64_t> creates{0}, writes{0}, bytes_written{0}, renames{0}, removes{0}, symlinks{0}, mkdirs{0};
  std::atomic<uint64_t> syncs{0};
  std::atomic<uint64_t> locks{0};
};

class FaultInjectionEnv : public EnvWrapper {
 public:
  explicit FaultInjectionEnv(Env* target = Env::Default()) : EnvWrapper(target) {}

  void add(FileFault f) { faults_.push_back(std::move(f)); }
  void add_write(WriteFault f) { write_faults_.push_back(std::move(f)); }
  void clear() {
    faults_.clear();
    write_faults_.clear();
  }
  FaultCounters& counters() { return counters_; }
  // list_dir() fails with this errno when non-zero.
  int list_errno = 0;

  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    counters_.opens++;
    const FileFault* f = match(path);
    if (f && f->open_errno) return Status::FromErrno(f->open_errno, "cannot open").with_file(path);
    WL_ASSIGN_OR_RETURN(auto inner, target()->open(path, o));
    return std::shared_ptr<RandomAccessFile>(
        std::make_shared<File>(std::move(inner), f ? *f : FileFault{}, f != nullptr, &counters_));
  }
  Result<uint64_t> file_size(const std::string& path) override {
    counters_.sizes++;
    return target()->file_size(path);
  }
  bool exists(const std::string& path) override {
    counters_.exists++;
    return target()->exists(path);
  }
  bool is_directory(const std::string& path) override {
    counters_.is_dirs++;
    return target()->is_directory(path);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    counters_.lists++;
    if (list_errno) return Status::FromErrno(list_errno, "cannot list directory").with_file(path);
    return target()->list_dir(path);
  }

  // ---- write side ----
  Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& o) override {
    counters_.creates++;
    const WriteFault* f = match_write(path);
    if (f && f->create_errno) return Status::FromErrno(f->create_errno, "cannot create").with_file(path);
    WL_ASSIGN_OR_RETURN(auto inner, target()->new_writable(path, o));
    return std::unique_ptr<WritableFile>(std::make_unique<Writable>(std::move(inner), f, this));
  }
  Status create_dirs(const std::string& path, unsigned mode) override {
    counters_.mkdirs++;
    return target()->create_dirs(path, mode);
  }
  Status rename(const std::string& from, const std::string& to) override {
    counters_.renames++;
    const WriteFault* f = match_write(to);
    if (f && f->rename_errno) return Status::FromErrno(f->rename_errno, "cannot rename " + from + " to").with_file(to);
    return target()->rename(from, to);
  }
  Status remove(const std::string& path) override {
    counters_.removes++;
    return target()->remove(path);
  }
  Status symlink(const std::string& t, const std::string& link) override {
    counters_.symlinks++;
    const WriteFault* f = match_write(link);
    if (f && f->symlink_errno) return Status::FromErrno(f->symlink_errno, "cannot create symlink").with_file(link);
    return target()->symlink(t, link);
  }
  Result<std::unique_ptr<FileLock>> open_lock(const std::string& path, unsigned mode) override {
    counters_.locks++;
    const WriteFault* f = match_write(path);
    if (f && f->lock_errno) return Status::FromErrno(f->lock_errno, "cannot open the lock file").with_file(path);
    return target()->open_lock(path, mode);
  }

 private:
  class Writable final : public WritableFile {
   public:
    Writable(std::unique_ptr<WritableFile> inner, const WriteFault* f, FaultInjectionEnv* env)
        : inner_(std::move(inner)), fault_(f ? std::optional<WriteFault>(*f) : std::nullopt), env_(env) {}
    const std::string& path() const override { return inner_->path(); }
    Status append(std::span<const std::byte> data) override {
      WL_RETURN_IF_ERROR(check(data.size()));
      return inner_->append(data);
    }
    Status write_at(uint64_t offset, std::span<const std::byte> data) override {
      WL_RETURN_IF_ERROR(check(data.size()));
      return inner_->write_at(offset, data);
    }
    Status truncate(uint64_t size) override { return inner_->truncate(size); }
    Result<uint64_t> size() const override { return inner_->size(); }
    Status sync() override {
      env_->counters_.syncs++;
      return inner_->sync();
    }
    Status close() override { return inner_->close(); }

   private:
    Status check(size_t n) {
      env_->counters_.writes++;
      const uint64_t before = env_->counters_.bytes_written.fetch_add(n);
      if (fault_ && fault_->enospc_after_bytes && before + n > *fault_->enospc_after_bytes)
        return Status::FromErrno(ENOSPC, fmt::format("write of {} bytes failed", n)).with_file(path());
      return Status();
    }
    std::unique_ptr<WritableFile> inner_;
    std::optional<WriteFault> fault_;
    FaultInjectionEnv* env_;
  };

  const WriteFault* match_write(const std::string& path) const {
    for (auto& f : write_faults_)
      if (path.find(f.path_part) != std::string::npos) return &f;
    return nullptr;
  }
  std::vector<WriteFault> write_faults_;

  class File final : public RandomAccessFile {
   public:
    File(std::shared_ptr<RandomAccessFile> inner, FileFault fault, bool armed, FaultCounters* c)
        : inner_(std::move(inner)), fault_(std::move(fault)), armed_(armed), counters_(c) {}
    const std::string& path() const override { return inner_->path(); }
    uint64_t size() const override { return inner_->size(); }
    std::string version() const override { return inner_->version(); }
    double cached_fraction() const override { return inner_->cached_fraction(); }
    double cached_fraction_in(uint64_t offset, uint64_t n) const override {
      return inner_->cached_fraction_in(offset, n);
    }
    size_t alignment() const override { return inner_->alignment(); }
    void advise(uint64_t offset, uint64_t n, Advice a) const override { inner_->advise(offset, n, a); }

    Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
      counters_->reads++;
      const uint64_t nth = reads_++;  // reads before this one
      if (armed_) {
        const uint64_t end = offset + dst.size();
        if (fault_.eio_from_offset && end > *fault_.eio_from_offset && !dst.empty())
          return Status::FromErrno(EIO, fmt::format("read at offset {}", offset)).with_file(path());
        if (fault_.eio_after_reads && nth >= *fault_.eio_after_reads)
          return Status::FromErrno(EIO, fmt::format("read at offset {}", offset)).with_file(path());
        if (fault_.truncate_to && nth >= fault_.truncate_after_reads && end > *fault_.truncate_to)
          return Status::OutOfRange(
                     fmt::format("unexpected end of file at offset {}", std::max(offset, *fault_.truncate_to)))
              .with_file(path());
      }
      WL_RETURN_IF_ERROR(inner_->read_at(offset, dst));
      counters_->bytes_read += dst.size();
      if (armed_ && fault_.change_after_reads && nth >= *fault_.change_after_reads)
        for (auto& b : dst) b ^= std::byte{0xff};
      return Status();
    }
    Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override {
      counters_->views++;
      if (armed_ && fault_.no_views) return RandomAccessFile::view(offset, n);
      auto v = inner_->view(offset, n);
      if (!v.ok()) return v;
      // The view is into the inner file: keep it alive as long as this one.
      return v;
    }

   private:
    std::shared_ptr<RandomAccessFile> inner_;
    FileFault fault_;
    bool armed_;
    FaultCounters* counters_;
    mutable std::atomic<uint64_t> reads_{0};
  };

  const FileFault* match(const std::string& path) const {
    for (auto& f : faults_)
      if (path.size() >= f.path_suffix.size() &&
          path.compare(path.size() - f.path_suffix.size(), f.path_suffix.size(), f.path_suffix) == 0)
        return &f;
    return nullptr;
  }

  std::vector<FileFault> faults_;
  FaultCounters counters_;
};

// A file held in memory. It may claim to be larger than its bytes
// (`claimed_size`): reads past the bytes return zeros without allocating, so
// a test can offer a "200 MB file" that costs nothing. Counts reads.
class StringFile final : public RandomAccessFile {
 public:
  StringFile(std::string path, std::string bytes, uint64_t claimed_size = 0)
      : path_(std::move(path)), bytes_(std::move(bytes)), size_(std::max<uint64_t>(claimed_size, bytes_.size())) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    reads++;
    bytes_read += dst.size();
    if (offset > size_ || dst.size() > size_ - offset) return Status::OutOfRange("read past the end").with_file(path_);
    size_t have = offset < bytes_.size() ? std::min<size_t>(dst.size(), bytes_.size() - offset) : 0;
    if (have) std::memcpy(dst.data(), bytes_.data() + offset, have);
    if (dst.size() > have) std::memset(dst.data() + have, 0, dst.size() - have);
    return Status();
  }
  mutable std::atomic<uint64_t> reads{0}, bytes_read{0};

 private:
  std::string path_;
  std::string bytes_;
  uint64_t size_;
};

// Writes a safetensors file of `count` U8 tensors "t0".."t{count-1}" of
// `bytes_each` bytes; byte j of tensor i is (i * 7 + j) & 0xff.
inline Status write_test_model(const std::string& path, size_t count, size_t bytes_each) {
  std::vector<Tensor> owned;
  std::vector<NamedTensor> named;
  owned.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(DType::U8, {static_cast<int64_t>(bytes_each)}));
    auto b = t.mutable_bytes();
    for (size_t j = 0; j < b.size(); ++j) b[j] = std::byte(static_cast<uint8_t>(i * 7 + j));
    owned.push_back(std::move(t));
    named.push_back({fmt::format("t{}", i), owned.back().view()});
  }
  return write_safetensors(path, named);
}

// True when `v` holds the bytes write_test_model() gave tensor `i`.
inline bool has_test_bytes(const TensorView& v, size_t i) {
  auto b = v.bytes();
  for (size_t j = 0; j < b.size(); ++j)
    if (b[j] != std::byte(static_cast<uint8_t>(i * 7 + j))) return false;
  return true;
}

}  // namespace wl::testing

// POSIX implementation of the Env seam: mmap and pread (optionally O_DIRECT) files.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "io/confined.h"
#include "io/posix_internal.h"
#include "io/unique_fd.h"
#include "util/checked.h"
#include "weightlift/io.h"
#include "weightlift/tensor.h"

namespace wl {

Result<std::span<const std::byte>> RandomAccessFile::view(uint64_t, uint64_t) const {
  return Status::Unimplemented("file is not memory-mapped").with_file(path());
}

void RandomAccessFile::advise(uint64_t, uint64_t, Advice) const {}

Status RandomAccessFile::read_scatter_at(uint64_t offset, std::span<const std::span<std::byte>> parts) const {
  for (std::span<std::byte> part : parts) {
    WL_RETURN_IF_ERROR(read_at(offset, part));
    offset += part.size();
  }
  return Status();
}

namespace {

void fadvise(int fd, uint64_t offset, uint64_t n, Advice advice) {
  if (fd < 0) return;
  int a = POSIX_FADV_NORMAL;
  switch (advice) {
    case Advice::kNormal: a = POSIX_FADV_NORMAL; break;
    case Advice::kSequential: a = POSIX_FADV_SEQUENTIAL; break;
    case Advice::kRandom: a = POSIX_FADV_RANDOM; break;
    case Advice::kWillNeed: a = POSIX_FADV_WILLNEED; break;
    case Advice::kDontNeed: a = POSIX_FADV_DONTNEED; break;
    case Advice::kPopulate: a = POSIX_FADV_WILLNEED; break;
    case Advice::kRelease: return;  // the page cache keeps the pages
  }
  (void)::posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(n), a);
}

std::string stat_version(const struct stat& st) {
  return fmt::format("{}:{}:{}:{}", static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                     static_cast<int64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
}

// Fraction of a sample of the file's pages in the page cache (0..1), or -1.
double sampled_residency(int fd, uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -1;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (size + page - 1) / page;
  const uint64_t samples = std::min<uint64_t>(pages, 256);
  uint64_t hits = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    uint64_t pg = i * pages / samples;
    unsigned char v = 0;
    if (::mincore(static_cast<char*>(p) + pg * page, page, &v) == 0 && (v & 1)) ++hits;
  }
  ::munmap(p, size);
  return static_cast<double>(hits) / static_cast<double>(samples);
}

#ifndef __NR_cachestat
#define __NR_cachestat 451  // Linux 6.5, the same number on every architecture
#endif

// Pages of [first_page, first_page + pages) the page cache holds
// (cachestat(), Linux 6.5), or -1 with errno set when the kernel cannot tell.
int64_t cached_pages(int fd, uint64_t first_page, uint64_t pages, uint64_t page) {
  struct {
    uint64_t off, len;
  } range{first_page * page, pages * page};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } cs{};
  if (::syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) return -1;
  return static_cast<int64_t>(std::min(cs.nr_cache, pages));
}

// Fraction of a sample of the file's pages in the page cache (0..1), or -1:
// 64 stretches of 16 pages spread evenly (counting a whole large file costs
// a walk of every page), or, on kernels before 6.5, mincore.
double residency(int fd, uint64_t size) {
  if (fd < 0 || size == 0) return -1;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (size + page - 1) / page;
  constexpr uint64_t kRun = 16;
  const uint64_t samples = std::min<uint64_t>(64, (pages + kRun - 1) / kRun);
  uint64_t cached = 0, asked = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    const uint64_t first = i * pages / samples, n = std::min(kRun, pages - first);
    const int64_t c = cached_pages(fd, first, n, page);
    if (c < 0) return errno == ENOSYS || errno == EPERM ? sampled_residency(fd, size) : -1;
    cached += static_cast<uint64_t>(c), asked += n;
  }
  return asked == 0 ? -1 : static_cast<double>(cached) / static_cast<double>(asked);
}

// The fraction of [offset, offset + n) in the page cache; -1 when the kernel
// cannot tell.
double range_residency(int fd, uint64_t size, uint64_t offset, uint64_t n) {
  if (fd < 0 || offset >= size || n == 0) return -1;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t first = offset / page, last = (offset + std::min(n, size - offset) + page - 1) / page;
  const int64_t c = cached_pages(fd, first, last - first, page);
  return c < 0 ? -1 : static_cast<double>(c) / static_cast<double>(last - first);
}

Status check_range(const RandomAccessFile& f, uint64_t offset, uint64_t n) {
  uint64_t end = 0;
  if (!checked_add(offset, n, &end) || end > f.size())
    return Status::OutOfRange(
               fmt::format("read of {} bytes at offset {} is past the end of the file ({} bytes)", n, offset, f.size()))
        .with_file(f.path());
  return Status();
}

// pread() until every byte arrived; EINTR and short reads are retried.
// `direct_align` (O_DIRECT descriptors): a count that is not a whole number of
// blocks means the file ended early (it shrank since open); retrying at that
// unaligned offset would fail with a misleading EINVAL.
Status pread_full(int fd, const std::string& path, uint64_t offset, std::byte* dst, size_t n, size_t direct_align = 0) {
  while (n > 0) {
    const size_t want = std::min<size_t>(n, size_t{1} << 30);
    ssize_t r = ::pread(fd, dst, want, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, fmt::format("read at offset {}", offset)).with_file(path);
    }
    if (direct_align && static_cast<size_t>(r) < want && static_cast<size_t>(r) % direct_align != 0)
      return Status::OutOfRange(fmt::format("unexpected end of file at offset {}", offset + static_cast<uint64_t>(r)))
          .with_file(path);
    if (r == 0) return Status::OutOfRange(fmt::format("unexpected end of file at offset {}", offset)).with_file(path);
    dst += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status();
}

class PosixFile : public RandomAccessFile {
 public:
  PosixFile(std::string path, UniqueFd fd, uint64_t size, std::string version)
      : path_(std::move(path)), fd_(std::move(fd)), size_(size), version_(std::move(version)) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  std::string version() const override { return version_; }
  double cached_fraction() const override { return residency(fd_.get(), size_); }
  double cached_fraction_in(uint64_t offset, uint64_t n) const override {
    return range_residency(fd_.get(), size_, offset, n);
  }
  void advise(uint64_t offset, uint64_t n, Advice advice) const override { fadvise(fd_.get(), offset, n, advice); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    WL_RETURN_IF_ERROR(check_range(*this, offset, dst.size()));
    return pread_full(fd_.get(), path_, offset, dst.data(), dst.size());
  }
  // io::posix_fd().
  virtual int descriptor(bool prefer_direct) const {
    (void)prefer_direct;
    return fd_.get();
  }

 protected:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_;
  std::string version_;
};

// O_DIRECT: aligned interior straight into the caller's buffer when it is
// aligned; head, tail and unaligned buffers go through an aligned bounce
// buffer. A second, buffered descriptor serves the unaligned last block.
class DirectFile final : public PosixFile {
 public:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kBounce = size_t{8} << 20;
  DirectFile(std::string path, UniqueFd direct_fd, UniqueFd buffered_fd, uint64_t size, std::string version)
      : PosixFile(std::move(path), std::move(buffered_fd), size, std::move(version)), direct_(std::move(direct_fd)) {}
  size_t alignment() const override { return kAlign; }
  int descriptor(bool prefer_direct) const override { return prefer_direct ? direct_.get() : fd_.get(); }

  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    WL_RETURN_IF_ERROR(check_range(*this, offset, dst.size()));
    std::byte* out = dst.data();
    uint64_t n = dst.size();
    Buffer bounce;
    while (n > 0) {
      uint64_t aligned_end_of_file = size_ & ~uint64_t(kAlign - 1);
      bool can_direct_in_place = offset % kAlign == 0 && reinterpret_cast<uintptr_t>(out) % kAlign == 0 &&
                                 n >= kAlign && offset + kAlign <= aligned_end_of_file;
      if (can_direct_in_place) {
        uint64_t len = std::min<uint64_t>(n, aligned_end_of_file - offset) & ~uint64_t(kAlign - 1);
        Status s = pread_full(direct_.get(), path_, offset, out, len, kAlign);
        if (!s.ok()) return s;
        out += len, offset += len, n -= len;
        continue;
      }
      uint64_t start = offset & ~uint64_t(kAlign - 1);
      if (start + kAlign > aligned_end_of_file) {  // last partial block: buffered read
        return pread_full(fd_.get(), path_, offset, out, n);
      }
      if (bounce.size() == 0) {
        WL_ASSIGN_OR_RETURN(bounce, Buffer::allocate(kBounce, kAlign));
      }
      uint64_t want_end = std::min<uint64_t>(offset + n, start + kBounce);
      uint64_t len =
          std::min<uint64_t>((want_end - start + kAlign - 1) & ~uint64_t(kAlign - 1), aligned_end_of_file - start);
      WL_RETURN_IF_ERROR(pread_full(direct_.get(), path_, start, bounce.data(), len, kAlign));
      uint64_t take = std::min<uint64_t>(n, start + len - offset);
      std::memcpy(out, bounce.data() + (offset - start), take);
      out += take, offset += take, n -= take;
    }
    return Status();
  }

 private:
  UniqueFd direct_;
};

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

// Maps [p, p+n) with read faults: MADV_POPULATE_READ, or, on kernels without
// it, one read per page. Never a write fault, so a private mapping is not
// copied (MAP_POPULATE on a writable private mapping copies every page).
void populate_read(std::byte* p, uint64_t n, uint64_t page) {
  if (::madvise(p, n, MADV_POPULATE_READ) == 0) return;
  if (errno != EINVAL) return;  // EFAULT/EIO (truncated file): readers see it as they read
  volatile const std::byte* q = p;
  for (uint64_t i = 0; i < n; i += page) (void)q[i];
}

class MmapFile final : public PosixFile {
 public:
  MmapFile(std::string path, UniqueFd fd, uint64_t size, std::string version, void* base)
      : PosixFile(std::move(path), std::move(fd), size, std::move(version)), base_(static_cast<std::byte*>(base)) {}
  ~MmapFile() override {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    WL_RETURN_IF_ERROR(check_range(*this, offset, dst.size()));
    // pread is as fast as copying from the mapping and survives truncation
    // with an error instead of SIGBUS.
    return pread_full(fd_.get(), path_, offset, dst.data(), dst.size());
  }
  Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override {
    WL_RETURN_IF_ERROR(check_range(*this, offset, n));
    if (n == 0) return std::span<const std::byte>();
    return std::span<const std::byte>(base_ + offset, n);
  }
  void advise(uint64_t offset, uint64_t n, Advice advice) const override {
    if (base_ == nullptr || n == 0) return PosixFile::advise(offset, n, advice);
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t end = std::min<uint64_t>(offset + std::min(n, size_ - std::min(offset, size_)), size_);
    if (advice == Advice::kRelease) {
      // Only 2 MiB stretches wholly inside the range: the page cache's large
      // folios are mapped whole (one PMD), and dropping part of one would
      // split the mapping under the neighbouring tensors still in use.
      constexpr uint64_t kHuge = uint64_t{2} << 20;
      const uint64_t a = (offset + kHuge - 1) & ~(kHuge - 1), b = end & ~(kHuge - 1);
      if (a < b) (void)::madvise(base_ + a, b - a, MADV_DONTNEED);
      return;
    }
    const uint64_t start = offset & ~(page - 1);
    if (start >= end) return;
    if (advice == Advice::kPopulate) {
      populate_read(base_ + start, end - start, page);
      return;
    }
    PosixFile::advise(offset, n, advice);
    int a = MADV_NORMAL;
    switch (advice) {
      case Advice::kNormal: a = MADV_NORMAL; break;
      case Advice::kSequential: a = MADV_SEQUENTIAL; break;
      case Advice::kRandom: a = MADV_RANDOM; break;
      case Advice::kWillNeed: a = MADV_WILLNEED; break;
      case Advice::kDontNeed: a = MADV_DONTNEED; break;
      case Advice::kPopulate:
      case Advice::kRelease: return;
    }
    (void)::madvise(base_ + start, end - start, a);
  }

 private:
  std::byte* base_;
};

// A file being written through pwrite(); append() keeps its own position.
class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, UniqueFd fd, uint64_t pos)
      : path_(std::move(path)), fd_(std::move(fd)), pos_(pos) {}
  ~PosixWritableFile() override { (void)close(); }
  const std::string& path() const override { return path_; }
  Status append(std::span<const std::byte> data) override {
    WL_RETURN_IF_ERROR(write_at(pos_, data));
    pos_ += data.size();
    return Status();
  }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    if (!fd_) return Status::Internal("write after close").with_file(path_);
    const std::byte* p = data.data();
    size_t n = data.size();
    while (n > 0) {
      ssize_t w = ::pwrite(fd_.get(), p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, fmt::format("write of {} bytes at offset {} failed", n, offset))
            .with_file(path_);
      }
      if (w == 0) return Status::IoError(fmt::format("write at offset {} made no progress", offset)).with_file(path_);
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status();
  }
  Status truncate(uint64_t size) override {
    if (!fd_) return Status::Internal("truncate after close").with_file(path_);
    if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0)
      return Status::FromErrno(errno, "cannot resize").with_file(path_);
    pos_ = size;
    return Status();
  }
  Result<uint64_t> size() const override {
    struct stat st {};
    if (!fd_ || ::fstat(fd_.get(), &st) != 0)
      return Status::FromErrno(fd_ ? errno : EBADF, "cannot stat").with_file(path_);
    return static_cast<uint64_t>(st.st_size);
  }
  Status sync() override {
    if (!fd_) return Status::Internal("sync after close").with_file(path_);
    if (::fsync(fd_.get()) != 0) return Status::FromErrno(errno, "fsync failed").with_file(path_);
    return Status();
  }
  Status close() override {
    if (!fd_) return Status();
    if (::close(fd_.release()) != 0) return Status::FromErrno(errno, "close failed").with_file(path_);
    return Status();
  }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t pos_;
};

// flock(2) on a descriptor of the lock file; closing the descriptor releases it.
class PosixFileLock final : public FileLock {
 public:
  PosixFileLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  Result<bool> try_lock() override {
    if (::flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) return true;
    int err = errno;
    if (err == EWOULDBLOCK || err == EINTR) return false;
    return Status::FromErrno(err, "cannot lock").with_file(path_);
  }
  Status lock() override {
    while (::flock(fd_.get(), LOCK_EX) != 0)
      if (errno != EINTR) return Status::FromErrno(errno, "cannot lock").with_file(path_);
    return Status();
  }
  void unlock() override { ::flock(fd_.get(), LOCK_UN); }

 private:
  std::string path_;
  UniqueFd fd_;
};

// What a file that is not a regular one is, for the message refusing it.
const char* file_type_name(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

Status not_regular(const std::string& path, mode_t m) {
  if (S_ISDIR(m)) return Status::InvalidArgument("is a directory, not a file").with_file(path);
  return Status::InvalidArgument(
             fmt::format("is {}, not a regular file: refusing to read it (a weight file must be a regular file)",
                         file_type_name(m)))
      .with_file(path);
}

// `path` opened for reading only if it is a regular file (after symlinks).
// stat() first, so a FIFO, socket or device is never opened at all; then the
// open itself is non-blocking (a FIFO swapped in after the stat cannot make it
// wait for a writer) and fstat() of the descriptor decides, on the object
// actually opened. The descriptor is returned blocking again.
Result<UniqueFd> open_regular(const std::string& path, int flags) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return Status::FromErrno(errno, "cannot open").with_file(path);
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(path);
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK) != 0)
    return Status::FromErrno(errno, "cannot make the descriptor blocking").with_file(path);
  return fd;
}

class PosixEnv final : public Env {
 public:
  Result<std::unique_ptr<FileLock>> open_lock(const std::string& path, unsigned mode) override {
    WL_ASSIGN_OR_RETURN(confined::Parent dir, confined::parent_of(path));
    const int nofollow = O_NOFOLLOW | O_CLOEXEC;
    // Created here (exclusively), else the existing one: never through a link, only a regular file.
    UniqueFd fd(::openat(dir.at(), dir.name.c_str(), O_RDWR | O_CREAT | O_EXCL | nofollow, mode));
    const bool created = static_cast<bool>(fd);
    if (!fd && errno == EEXIST) fd.reset(::openat(dir.at(), dir.name.c_str(), O_RDWR | nofollow));
    if (!fd && errno == EACCES)
      fd.reset(::openat(dir.at(), dir.name.c_str(), O_RDONLY | nofollow));  // flock needs no write
    if (!fd && errno == ELOOP) return confined::planted_link(path);
    if (!fd) return Status::FromErrno(errno, "cannot open the lock file").with_file(path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "cannot stat the lock file").with_file(path);
    if (!S_ISREG(st.st_mode))
      return Status::PermissionDenied("the lock file is not a regular file; refusing to use it").with_file(path);
    // The umask would narrow `mode`; widen it again so other users can lock
    // too (only on a file of ours: another user's keeps its mode).
    if (created || st.st_uid == ::geteuid()) (void)::fchmod(fd.get(), mode);
    return std::unique_ptr<FileLock>(std::make_unique<PosixFileLock>(path, std::move(fd)));
  }

  void confine_writes(const std::string& dir) override { confined::add_root(dir); }
  bool is_symlink(const std::string& path) override {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }

  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options) override {
    WL_ASSIGN_OR_RETURN(UniqueFd owned, open_regular(path, O_RDONLY));
    const int fd = owned.get();
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(path);
    uint64_t size = static_cast<uint64_t>(st.st_size);
    std::string version = stat_version(st);
    if (!options.expect_version.empty() && options.expect_version != version)
      return Status::Aborted("the file changed since the load was planned (it was replaced or rewritten)")
          .with_file(path);
    switch (options.mode) {
      case FileMode::kMmap:
      case FileMode::kMmapPrivate: {
        if (size == 0)
          return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), 0, version));
        const bool priv = options.mode == FileMode::kMmapPrivate;
        int flags = (priv ? MAP_PRIVATE : MAP_SHARED) | (options.populate && !priv ? MAP_POPULATE : 0);
        void* base = ::mmap(nullptr, size, priv ? PROT_READ | PROT_WRITE : PROT_READ, flags, fd, 0);
        if (base == MAP_FAILED) return Status::FromErrno(errno, "cannot mmap").with_file(path);
        if (options.populate && priv)
          populate_read(static_cast<std::byte*>(base), size, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
        return std::shared_ptr<RandomAccessFile>(
            std::make_shared<MmapFile>(path, std::move(owned), size, version, base));
      }
      case FileMode::kPread:
        return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), size, version));
      case FileMode::kDirect: {
        // Opened again by path: the same file or none (a FIFO put there since cannot make it hang).
        auto direct = open_regular(path, O_RDONLY | O_DIRECT);
        struct stat dst {};
        if (!direct.ok() || ::fstat(direct->get(), &dst) != 0 || dst.st_dev != st.st_dev ||
            dst.st_ino != st.st_ino) {  // tmpfs and some FUSE filesystems refuse O_DIRECT: buffered instead
          return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), size, version));
        }
        return std::shared_ptr<RandomAccessFile>(
            std::make_shared<DirectFile>(path, std::move(*direct), std::move(owned), size, version));
      }
    }
    return Status::Internal("unknown file mode");
  }

  Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& o) override {
    WL_ASSIGN_OR_RETURN(confined::Parent dir, confined::parent_of(path));
    const bool truncate = o.truncate && !o.adopt;
    const int flags = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | (o.adopt ? 0 : O_CREAT) | (truncate ? O_TRUNC : 0) |
                      (o.exclusive && !o.adopt ? O_EXCL : 0);
    int fd = ::openat(dir.at(), dir.name.c_str(), flags, static_cast<mode_t>(o.mode));
    if (fd < 0 && errno == ELOOP) return confined::planted_link(path);
    if (fd < 0) return Status::FromErrno(errno, o.adopt ? "cannot open" : "cannot create").with_file(path);
    UniqueFd owned(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(path);
    if (o.adopt && (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid() || st.st_nlink != 1))
      return Status::PermissionDenied(fmt::format("not resuming it: {} (only a regular file of this user with one link "
                                                  "is resumed; it is left alone)",
                                                  !S_ISREG(st.st_mode) ? "not a regular file"
                                                  : st.st_uid != ::geteuid()
                                                      ? fmt::format("owned by uid {}, not {}", st.st_uid, ::geteuid())
                                                      : fmt::format("{} hard links", st.st_nlink)))
          .with_file(path);
    const uint64_t pos = truncate ? 0 : static_cast<uint64_t>(st.st_size);
    return std::unique_ptr<WritableFile>(std::make_unique<PosixWritableFile>(path, std::move(owned), pos));
  }

  Status create_dirs(const std::string& path, unsigned mode) override {
    if (path.empty()) return Status();
    WL_ASSIGN_OR_RETURN(confined::Parent dir, confined::parent_of(path, /*create=*/true, mode));
    if (dir.fd) {  // below a confined directory: made and checked without following a link
      if (::mkdirat(dir.at(), dir.name.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
        return Status::FromErrno(errno, "cannot create directory").with_file(path);
      struct stat st {};
      if (::fstatat(dir.at(), dir.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        return Status::FromErrno(errno, "cannot stat").with_file(path);
      if (S_ISLNK(st.st_mode)) return confined::planted_link(path);
      if (!S_ISDIR(st.st_mode)) return Status::AlreadyExists("exists and is not a directory").with_file(path);
      return Status();
    }
    std::string cur;
    size_t i = 0;
    while (i <= path.size()) {
      size_t j = path.find('/', i);
      if (j == std::string::npos) j = path.size();
      cur = path.substr(0, j);
      if (!cur.empty() && ::mkdir(cur.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
        return Status::FromErrno(errno, "cannot create directory").with_file(cur);
      i = j + 1;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::AlreadyExists("exists and is not a directory").with_file(path);
    return Status();
  }
  Status rename(const std::string& from, const std::string& to) override {
    WL_ASSIGN_OR_RETURN(confined::Parent a, confined::parent_of(from));
    WL_ASSIGN_OR_RETURN(confined::Parent b, confined::parent_of(to));
    if (::renameat(a.at(), a.name.c_str(), b.at(), b.name.c_str()) != 0)
      return Status::FromErrno(errno, fmt::format("cannot rename {} to", from)).with_file(to);
    return Status();
  }
  Status remove(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(confined::Parent dir, confined::parent_of(path));
    if (::unlinkat(dir.at(), dir.name.c_str(), 0) == 0) return Status();
    if (errno == EISDIR || errno == EPERM) {
      if (::unlinkat(dir.at(), dir.name.c_str(), AT_REMOVEDIR) == 0) return Status();
    }
    return Status::FromErrno(errno, "cannot remove").with_file(path);
  }
  Status symlink(const std::string& target, const std::string& link) override {
    WL_ASSIGN_OR_RETURN(confined::Parent dir, confined::parent_of(link));
    if (::symlinkat(target.c_str(), dir.at(), dir.name.c_str()) != 0)
      return Status::FromErrno(errno, "cannot create symlink").with_file(link);
    return Status();
  }
  Status sync_dir(const std::string& path) override {
    UniqueFd dfd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dfd) return Status::FromErrno(errno, "cannot open directory").with_file(path);
    if (::fsync(dfd.get()) != 0) return Status::FromErrno(errno, "fsync of directory failed").with_file(path);
    return Status();
  }

  Result<uint64_t> file_size(const std::string& path) override {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(path);
    return static_cast<uint64_t>(st.st_size);
  }
  bool exists(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
  }
  bool is_directory(const std::string& path) override {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return Status::FromErrno(errno, "cannot list directory").with_file(path);
    std::vector<DirEntry> out;
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      DirEntry de;
      de.name = name;
      struct stat st {};
      std::string full = path + "/" + name;
      if (::lstat(full.c_str(), &st) == 0) de.is_symlink = S_ISLNK(st.st_mode);
      if (::stat(full.c_str(), &st) == 0) {
        de.is_dir = S_ISDIR(st.st_mode);
        if (!de.is_dir) de.size = static_cast<uint64_t>(st.st_size);
      }
      out.push_back(std::move(de));
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }
};

}  // namespace

// ---- Env's write side: sources without one refuse it ----
Result<std::unique_ptr<WritableFile>> Env::new_writable(const std::string& path, const WriteOptions&) {
  return Status::Unimplemented("this source cannot write files").with_file(path);
}
Status Env::create_dirs(const std::string& path, unsigned) {
  return Status::Unimplemented("this source cannot create directories").with_file(path);
}
Status Env::rename(const std::string&, const std::string& to) {
  return Status::Unimplemented("this source cannot rename files").with_file(to);
}
Status Env::remove(const std::string& path) {
  return Status::Unimplemented("this source cannot remove files").with_file(path);
}
Status Env::symlink(const std::string&, const std::string& link) {
  return Status::Unimplemented("this source cannot create symlinks").with_file(link);
}
Status Env::sync_dir(const std::string& path) {
  return Status::Unimplemented("this source has no directories to sync").with_file(path);
}
Result<std::unique_ptr<FileLock>> Env::open_lock(const std::string& path, unsigned) {
  return Status::Unimplemented("this source cannot lock files").with_file(path);
}

std::string_view url_scheme(std::string_view path) {
  size_t p = path.find("://");
  if (p == std::string_view::npos || p == 0) return {};
  for (size_t i = 0; i < p; ++i) {
    char c = path[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
    if (!ok) return {};
  }
  return path.substr(0, p);
}

Env* local_env() {
  static PosixEnv env;
  return &env;
}

Result<std::string> read_file_to_string(const std::string& path, uint64_t max_bytes, Env* env) {
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, {.mode = FileMode::kPread}));
  if (f->size() > max_bytes)
    return Status::OutOfRange(fmt::format("file is {} bytes, more than the {} allowed", f->size(), max_bytes))
        .with_file(path);
  std::string s(f->size(), '\0');
  WL_RETURN_IF_ERROR(f->read_at(0, std::as_writable_bytes(std::span(s.data(), s.size()))));
  return s;
}

Status write_file_atomic(const std::string& path, std::string_view contents, Env* env) {
  WL_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path, 0644, env));
  WL_RETURN_IF_ERROR(f.append(contents));
  return f.commit();
}

std::string parent_dir(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto pos = path.rfind('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

std::string base_name(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto pos = path.rfind('/');
  return std::string(pos == std::string_view::npos ? path : path.substr(pos + 1));
}

std::string join_path(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  std::string out(a);
  if (out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

namespace io {
int posix_fd(const RandomAccessFile& file, bool prefer_direct) {
  const auto* p = dynamic_cast<const PosixFile*>(&file);
  return p ? p->descriptor(prefer_direct) : -1;
}
}  // namespace io

}  // namespace wl

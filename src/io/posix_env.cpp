// POSIX implementation of the Env seam: mmap and pread (optionally O_DIRECT) files.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "io/unique_fd.h"
#include "util/checked.h"
#include "weightlift/io.h"
#include "weightlift/tensor.h"

namespace wl {

Result<std::span<const std::byte>> RandomAccessFile::view(uint64_t, uint64_t) const {
  return Status::Unimplemented("file is not memory-mapped").with_file(path());
}

void RandomAccessFile::advise(uint64_t offset, uint64_t n, Advice advice) const {
  int fd_ = fd();
  if (fd_ < 0) return;
  int a = POSIX_FADV_NORMAL;
  switch (advice) {
    case Advice::kNormal: a = POSIX_FADV_NORMAL; break;
    case Advice::kSequential: a = POSIX_FADV_SEQUENTIAL; break;
    case Advice::kRandom: a = POSIX_FADV_RANDOM; break;
    case Advice::kWillNeed: a = POSIX_FADV_WILLNEED; break;
    case Advice::kDontNeed: a = POSIX_FADV_DONTNEED; break;
  }
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(n), a);
}

namespace {

Status check_range(const RandomAccessFile& f, uint64_t offset, uint64_t n) {
  uint64_t end = 0;
  if (!checked_add(offset, n, &end) || end > f.size())
    return Status::OutOfRange(fmt::format("read of {} bytes at offset {} is past the end of the file ({} bytes)", n,
                                          offset, f.size()))
        .with_file(f.path());
  return Status();
}

// pread() until every byte arrived; EINTR and short reads are retried.
// `direct_align` (O_DIRECT descriptors): a count that is not a whole number of
// blocks means the file ended early (it shrank since open); retrying at that
// unaligned offset would fail with a misleading EINVAL.
Status pread_full(int fd, const std::string& path, uint64_t offset, std::byte* dst, size_t n,
                  size_t direct_align = 0) {
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
  PosixFile(std::string path, UniqueFd fd, uint64_t size) : path_(std::move(path)), fd_(std::move(fd)), size_(size) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return size_; }
  int fd() const override { return fd_.get(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    WL_RETURN_IF_ERROR(check_range(*this, offset, dst.size()));
    return pread_full(fd_.get(), path_, offset, dst.data(), dst.size());
  }

 protected:
  std::string path_;
  UniqueFd fd_;
  uint64_t size_;
};

// O_DIRECT: aligned interior straight into the caller's buffer when it is
// aligned; head, tail and unaligned buffers go through an aligned bounce
// buffer. A second, buffered descriptor serves the unaligned last block.
class DirectFile final : public PosixFile {
 public:
  static constexpr size_t kAlign = 4096;
  static constexpr size_t kBounce = size_t{8} << 20;
  DirectFile(std::string path, UniqueFd direct_fd, UniqueFd buffered_fd, uint64_t size)
      : PosixFile(std::move(path), std::move(buffered_fd), size), direct_(std::move(direct_fd)) {}
  size_t alignment() const override { return kAlign; }

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
      uint64_t len = std::min<uint64_t>((want_end - start + kAlign - 1) & ~uint64_t(kAlign - 1),
                                        aligned_end_of_file - start);
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

class MmapFile final : public PosixFile {
 public:
  MmapFile(std::string path, UniqueFd fd, uint64_t size, void* base)
      : PosixFile(std::move(path), std::move(fd), size), base_(static_cast<std::byte*>(base)) {}
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
    PosixFile::advise(offset, n, advice);
    if (base_ == nullptr || n == 0) return;
    uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t start = offset & ~(page - 1);
    uint64_t end = std::min<uint64_t>(offset + n, size_);
    if (start >= end) return;
    int a = MADV_NORMAL;
    switch (advice) {
      case Advice::kNormal: a = MADV_NORMAL; break;
      case Advice::kSequential: a = MADV_SEQUENTIAL; break;
      case Advice::kRandom: a = MADV_RANDOM; break;
      case Advice::kWillNeed: a = MADV_WILLNEED; break;
      case Advice::kDontNeed: a = MADV_DONTNEED; break;
    }
    (void)::madvise(base_ + start, end - start, a);
  }

 private:
  std::byte* base_;
};

class PosixEnv final : public Env {
 public:
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "cannot open").with_file(path);
    UniqueFd owned(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "cannot stat").with_file(path);
    if (S_ISDIR(st.st_mode)) return Status::InvalidArgument("is a directory, not a file").with_file(path);
    uint64_t size = static_cast<uint64_t>(st.st_size);
    switch (options.mode) {
      case FileMode::kMmap: {
        if (size == 0) return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), 0));
        int flags = MAP_SHARED | (options.populate ? MAP_POPULATE : 0);
        void* base = ::mmap(nullptr, size, PROT_READ, flags, fd, 0);
        if (base == MAP_FAILED) return Status::FromErrno(errno, "cannot mmap").with_file(path);
        return std::shared_ptr<RandomAccessFile>(std::make_shared<MmapFile>(path, std::move(owned), size, base));
      }
      case FileMode::kPread:
        return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), size));
      case FileMode::kDirect: {
        int dfd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (dfd < 0) {  // tmpfs and some FUSE filesystems refuse O_DIRECT: buffered instead
          return std::shared_ptr<RandomAccessFile>(std::make_shared<PosixFile>(path, std::move(owned), size));
        }
        return std::shared_ptr<RandomAccessFile>(
            std::make_shared<DirectFile>(path, UniqueFd(dfd), std::move(owned), size));
      }
    }
    return Status::Internal("unknown file mode");
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
      if (::stat(full.c_str(), &st) == 0) de.is_dir = S_ISDIR(st.st_mode);
      out.push_back(std::move(de));
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }
};

}  // namespace

Env* Env::Default() {
  static PosixEnv env;
  return &env;
}

Result<std::string> read_file_to_string(const std::string& path, uint64_t max_bytes) {
  WL_ASSIGN_OR_RETURN(auto f, Env::Default()->open(path, {.mode = FileMode::kPread}));
  if (f->size() > max_bytes)
    return Status::OutOfRange(fmt::format("file is {} bytes, more than the {} allowed", f->size(), max_bytes))
        .with_file(path);
  std::string s(f->size(), '\0');
  WL_RETURN_IF_ERROR(f->read_at(0, std::as_writable_bytes(std::span(s.data(), s.size()))));
  return s;
}

Status write_file_atomic(const std::string& path, std::string_view contents) {
  WL_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::create(path));
  WL_RETURN_IF_ERROR(f.append(contents));
  return f.commit();
}

}  // namespace wl

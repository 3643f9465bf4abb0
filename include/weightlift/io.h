// weightlift/io.h: the I/O seam (leveldb's Env, rocksdb's read contract).
//
// All file access of the library goes through Env: reads, writes, renames,
// directories, locks. Tests count or break any of it (FaultInjectionEnv in
// tests/), and other sources stand in for local files behind the same
// interface.
//
// Sources: this layer is POSIX files (local_env()) and nothing else.
// Env::Default() composes them with the URL sources (HTTP, S3) and the path
// overlays of sources above this seam (src/sources/, sources.h). Everything
// above the seam (formats, planner, strategies, destinations) is the same for
// a local file and an object.
//
// The read contract: RandomAccessFile::read_at() fills the whole buffer or
// returns an error. Short reads, EINTR and (for network sources) dropped
// connections are retried inside; a range past the end is kOutOfRange. No
// caller ever sees a partial read.
//
// Versions: a RandomAccessFile reads one version of its file for its whole
// life (an open descriptor, an object's ETag). version() names it, so that a
// reader which closes and reopens a file (to stay under the descriptor
// limit) can insist on the same bytes: OpenOptions::expect_version makes
// open() fail with kAborted when the file was replaced in between.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/status.h"

namespace wl {

// kPopulate: map the range's pages into this process now, reading them in
// first when they are not cached (MADV_POPULATE_READ on a mapping: no page is
// copied, a private mapping stays copy-on-write; WILLNEED otherwise).
// kRelease: drop this process's mapping of the 2 MiB-aligned stretches lying
// wholly inside the range (MADV_DONTNEED on the mapping only, never splitting
// a huge mapping; the page cache keeps the pages; a private mapping's written
// pages are discarded). Only for ranges nothing refers to any more; a no-op
// for files that are not mapped.
enum class Advice { kNormal, kSequential, kRandom, kWillNeed, kDontNeed, kPopulate, kRelease };

enum class FileMode {
  kMmap,         // mapped read-only and shared; view() returns zero-copy spans
  kMmapPrivate,  // mapped copy-on-write (MAP_PRIVATE, PROT_READ|PROT_WRITE):
                 // view() spans may be written through a const_cast; a write
                 // copies the page for this process and never reaches the file
  kPread,        // buffered pread()
  kDirect,       // pread() with O_DIRECT, falling back to buffered where refused
};

struct OpenOptions {
  FileMode mode = FileMode::kMmap;
  bool populate = false;  // kMmap*: pre-fault the mapping (read faults only: a private mapping stays copy-on-write)
  // Non-empty: open() fails with kAborted ("changed since it was planned")
  // unless the file's version() equals this.
  std::string expect_version;
};

// A hash of a whole file that its source vouches for (an object store's
// metadata), to check a copy of the file against (docs/integrity.md).
struct VouchedHash {
  std::string algorithm;  // "crc32c", "crc32", "sha256", "sha1" or "md5"
  std::string hex;        // the digest, lower-case hex (a CRC's 4 bytes big-endian)
  std::string from;       // where it was found: "x-goog-hash", "x-amz-checksum-crc32c", "ETag"
};

// An open, immutable file. Thread-safe: every method may be called from many
// threads at once. Created only through Env::open(); held by shared_ptr so
// that views can keep it alive. Sources that are not local files (HTTP, S3)
// implement the same contract; view() is then kUnimplemented.
class RandomAccessFile : public std::enable_shared_from_this<RandomAccessFile> {
 public:
  virtual ~RandomAccessFile() = default;

  virtual const std::string& path() const = 0;
  // Size at open time, in bytes.
  virtual uint64_t size() const = 0;

  // Reads exactly dst.size() bytes starting at `offset` into dst, or fails.
  // Errors name the file (or URL). Any alignment of dst/offset is accepted.
  virtual Status read_at(uint64_t offset, std::span<std::byte> dst) const = 0;

  // Reads the contiguous range [offset, offset + total size of parts) into
  // `parts`, in order (a scatter read: one request for a network source,
  // where several small tensors lie side by side). All or error, as read_at().
  // The default reads each part with read_at().
  virtual Status read_scatter_at(uint64_t offset, std::span<const std::span<std::byte>> parts) const;

  // Zero-copy bytes [offset, offset+n) when the file is memory-mapped;
  // kUnimplemented otherwise. The span lives as long as this object.
  virtual Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const;

  // Alignment that makes reads fastest (4096 for O_DIRECT files, else 1).
  virtual size_t alignment() const { return 1; }

  // A hint (posix_fadvise / madvise); failures are ignored.
  virtual void advise(uint64_t offset, uint64_t n, Advice advice) const;

  // The version this object reads: "dev:ino:size:mtime_ns" for a local file,
  // the ETag for an object. "" when the source cannot tell (never matches an
  // expect_version).
  virtual std::string version() const { return {}; }

  // Fraction of the file's pages that sit in the page cache (0..1; counted
  // by cachestat(), or a sample on older kernels), or -1 when it cannot be
  // told (not a local file). Cheap enough to ask per file per load.
  virtual double cached_fraction() const { return -1; }
  // At least 90% of the file is in the page cache: a pass that would read it
  // in (eager's whole-file read, prefetch, readahead hints) has nothing to do.
  bool mostly_cached() const { return cached_fraction() >= 0.9; }
  // The same for bytes [offset, offset + n) alone, counted exactly
  // (cachestat()); -1 when it cannot be told (older kernels too).
  virtual double cached_fraction_in(uint64_t offset, uint64_t n) const {
    (void)offset, (void)n;
    return -1;
  }

  // True for sources where every read is a network request (HTTP, S3): the
  // planner then prefers few large ranged reads and never maps the file.
  virtual bool is_remote() const { return false; }

  // The hash the source vouches for this version of the file (GCS's
  // x-goog-hash, S3's x-amz-checksum-* or single-part MD5 ETag), nullopt when
  // it offers none (local files, plain URLs, multipart objects).
  virtual std::optional<VouchedHash> vouched_hash() const { return std::nullopt; }
};

// A file being written. Not thread-safe, except write_at() on disjoint ranges.
// Every method returns all-or-error (ENOSPC is kIoError naming the file).
// The destructor closes the file without syncing.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual const std::string& path() const = 0;
  virtual Status append(std::span<const std::byte> data) = 0;
  Status append(std::string_view text) { return append(std::as_bytes(std::span(text.data(), text.size()))); }
  // Writes at an offset (for writers that fill a file out of order).
  virtual Status write_at(uint64_t offset, std::span<const std::byte> data) = 0;
  // Sets the size (ftruncate); the append position moves to the new end.
  virtual Status truncate(uint64_t size) = 0;
  // Current size in bytes.
  virtual Result<uint64_t> size() const = 0;
  virtual Status sync() = 0;   // fsync
  virtual Status close() = 0;  // idempotent; the first error of close()
};

// A writable file is never opened through a symbolic link (O_NOFOLLOW: a link
// at the final name is kPermissionDenied), whatever the options.
struct WriteOptions {
  unsigned mode = 0644;    // permission bits for a new file (minus umask)
  bool truncate = true;    // false: keep existing contents (resume), append at the end
  bool exclusive = false;  // fail with kAlreadyExists when the file exists (O_CREAT|O_EXCL)
  // Resume an existing file only: never created; opened only when it is a
  // regular file owned by this process's effective user with a single link,
  // else kPermissionDenied and the file is left as it is (a partial file a
  // neighbour planted in a shared cache is not adopted).
  bool adopt = false;
};

struct DirEntry {
  std::string name;  // base name
  bool is_dir = false;
  bool is_symlink = false;
  uint64_t size = 0;  // for files, when the listing tells it (object stores do); else 0
};

// An advisory, exclusive lock on one file (flock(2): it belongs to the open
// file, so two FileLocks exclude each other even in one process). Not
// thread-safe; the destructor releases a held lock and closes the file.
class FileLock {
 public:
  virtual ~FileLock() = default;
  // One attempt, never blocks: true when the lock is now held.
  virtual Result<bool> try_lock() = 0;
  // Blocks until the lock is held.
  virtual Status lock() = 0;
  virtual void unlock() = 0;
};

// The environment: opening, listing, writing and locking files.
// Default() is the process-wide composition of the sources (POSIX files,
// URL schemes, path overlays; defined by src/sources/, see sources.h);
// thread-safe. Write-side methods on a URL are kUnimplemented unless the
// scheme's source supports them.
class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  virtual Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options = {}) = 0;
  virtual Result<uint64_t> file_size(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual bool is_directory(const std::string& path) = 0;
  // Entries of a directory (for an object store: the keys and common prefixes
  // one level below "prefix/"), sorted by name.
  virtual Result<std::vector<DirEntry>> list_dir(const std::string& path) = 0;

  // ---- write side ----
  virtual Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& options = {});
  // mkdir -p; an existing directory is fine.
  virtual Status create_dirs(const std::string& path, unsigned mode = 0755);
  // rename(2): atomic replacement of `to` on the same filesystem.
  virtual Status rename(const std::string& from, const std::string& to);
  // unlink(2) (or rmdir for an empty directory); a missing path is kNotFound.
  virtual Status remove(const std::string& path);
  // A symbolic link at `link` pointing to `target` (stored as given).
  virtual Status symlink(const std::string& target, const std::string& link);
  // fsync of a directory (after a rename into it). Failures are ignored by callers that only hint.
  virtual Status sync_dir(const std::string& path);
  // The lock file at `path`, created (with `mode`, whatever the umask) when
  // missing; not locked yet. The directory must exist. Never through a
  // symbolic link, and only a regular file (else kPermissionDenied).
  virtual Result<std::unique_ptr<FileLock>> open_lock(const std::string& path, unsigned mode = 0666);
  // From now on (process-wide, for local files), every write below `dir` --
  // new_writable, create_dirs, rename, remove, symlink, open_lock -- resolves
  // each path component below `dir` without following a symbolic link (openat
  // with O_NOFOLLOW, one component at a time: no window between a check and
  // the write). A link planted below `dir` (blobs/, snapshots/, refs/ of a
  // shared cache) is kPermissionDenied naming it, never written through; a
  // link as the last component of rename/remove/symlink is the entry itself,
  // as POSIX has it. `dir` itself may be a link (the caller chose it). A
  // no-op for sources that write nothing. Thread-safe.
  virtual void confine_writes(const std::string& dir) { (void)dir; }
  // lstat(2): `path` itself is a symbolic link (false when missing, or for
  // sources without links).
  virtual bool is_symlink(const std::string& path) {
    (void)path;
    return false;
  }

  // Blocks until the file at `path` is final when a source is still writing
  // it (a Hub download being loaded, see hub.h's HubSource) and returns that
  // source's verdict (a hash mismatch, a failed download). OK at once for a
  // file that is simply there. load_files() calls it for every file it loaded.
  virtual Status wait_complete(const std::string& path) {
    (void)path;
    return Status();
  }
  // True while a source is still writing the file at `path` (the Hub's load
  // while downloading): its reads may wait for bytes to arrive. A fact the
  // engine's plan asks for (read_path.h).
  virtual bool arriving(const std::string& path) {
    (void)path;
    return false;
  }
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
  Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& o) override {
    return target_->new_writable(path, o);
  }
  Status create_dirs(const std::string& path, unsigned mode) override { return target_->create_dirs(path, mode); }
  Status rename(const std::string& from, const std::string& to) override { return target_->rename(from, to); }
  Status remove(const std::string& path) override { return target_->remove(path); }
  Status symlink(const std::string& target, const std::string& link) override { return target_->symlink(target, link); }
  Status sync_dir(const std::string& path) override { return target_->sync_dir(path); }
  Result<std::unique_ptr<FileLock>> open_lock(const std::string& path, unsigned mode) override {
    return target_->open_lock(path, mode);
  }
  void confine_writes(const std::string& dir) override { target_->confine_writes(dir); }
  bool is_symlink(const std::string& path) override { return target_->is_symlink(path); }
  Status wait_complete(const std::string& path) override { return target_->wait_complete(path); }
  bool arriving(const std::string& path) override { return target_->arriving(path); }
  Env* target() const { return target_; }

 private:
  Env* target_;
};

// ---- URLs ----
// "s3" in "s3://bucket/key"; "" for a local path.
std::string_view url_scheme(std::string_view path);
inline bool is_url(std::string_view path) { return !url_scheme(path).empty(); }

// The POSIX files behind Env::Default(), without URL schemes or overlays.
Env* local_env();

// Writes a file atomically through an Env: bytes go to a temporary file in the
// same directory ("<name>.tmp.XXXXXX"); commit() syncs it, renames it over the
// final name and syncs the directory. If commit() is not reached (error,
// exception, crash) the final name is untouched and the temporary is removed
// by the destructor. Not thread-safe, except write_at() on disjoint ranges. Move-only.
class AtomicFile {
 public:
  static Result<AtomicFile> create(const std::string& final_path, unsigned mode = 0644, Env* env = Env::Default());
  AtomicFile(AtomicFile&& o) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  AtomicFile(const AtomicFile&) = delete;
  ~AtomicFile();

  Status append(std::span<const std::byte> data);
  Status append(std::string_view text) { return append(std::as_bytes(std::span(text.data(), text.size()))); }
  Status write_at(uint64_t offset, std::span<const std::byte> data);
  // Sets the size up front so write_at() can fill it in parallel.
  Status resize(uint64_t size);
  // Renames the temporary into place. sync (the default) fsyncs the file
  // first and the directory after: the new contents survive a crash. Without
  // it the rename is still atomic for readers, but a crash may leave the old
  // file or an empty one (what safetensors' own save_file guarantees).
  Status commit(bool sync = true);
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

 private:
  AtomicFile(Env* env, std::string final_path, std::string temp_path, std::unique_ptr<WritableFile> file)
      : env_(env), final_path_(std::move(final_path)), temp_path_(std::move(temp_path)), file_(std::move(file)) {}
  Env* env_ = nullptr;
  std::string final_path_;
  std::string temp_path_;
  std::unique_ptr<WritableFile> file_;
  bool committed_ = false;
};

// Convenience: the whole file, through `env`.
Result<std::string> read_file_to_string(const std::string& path, uint64_t max_bytes = uint64_t{1} << 30,
                                        Env* env = Env::Default());
Status write_file_atomic(const std::string& path, std::string_view contents, Env* env = Env::Default());

// "a/b" of "a/b/c"; "." for a bare name; "/" for "/c".
std::string parent_dir(std::string_view path);
// "c" of "a/b/c" (and of "a/b/c/"); URLs alike.
std::string base_name(std::string_view path);
// a + "/" + b without doubling the slash.
std::string join_path(std::string_view a, std::string_view b);

}  // namespace wl

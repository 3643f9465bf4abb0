// Private helpers shared by src/hub/*.cpp.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "weightlift/http.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/progress.h"
#include "weightlift/text.h"

namespace wl {

Status check_repo_id(const std::string& repo_id);
Status check_revision(const std::string& rev);
bool is_commit_hash(const std::string& s);
bool is_safe_etag(const std::string& s);
// Lower-case hex of exactly `n` characters.
bool is_hex_of(const std::string& s, size_t n);

// A finished blob: a file under its final name, not a link (a link planted in blobs/ is replaced by the
// download, whose rename never follows it).
inline bool blob_present(Env* env, const std::string& blob) { return env->exists(blob) && !env->is_symlink(blob); }

// Free bytes on the disk of `dir` for an unprivileged writer; nullopt when unknown.
std::optional<uint64_t> free_disk_bytes(const std::string& dir);

// The Env a Hub call reads and writes through (o.env, else Env::Default()).
inline Env* hub_env(const HubOptions& o) { return o.env ? o.env : Env::Default(); }

// Shared state of one Hub call: settings after the environment is consulted,
// the HTTP client, the progress bar. Thread-safe.
struct HubCtx {
  const HubOptions& o;
  HttpClient http;
  std::optional<std::string> token;
  Status token_status;  // why there is no token when one was given unusable: every request is refused
  std::string cache;
  Env* env;
  std::mutex progress_mu;
  std::unique_ptr<ProgressBar> bar;
  std::atomic<uint64_t> done_bytes{0};

  // Every write below the cache root is confined (Env::confine_writes): no link planted in a shared cache
  // is written through.
  explicit HubCtx(const HubOptions& opts) : o(opts), http(opts.http), cache(hub_cache_dir(opts)), env(hub_env(opts)) {
    env->confine_writes(cache);
    auto t = hub_token(opts);
    if (t.ok())
      token = std::move(*t);
    else
      token_status = std::move(t).status();
  }
  std::vector<std::pair<std::string, std::string>> headers(bool auth) const;
  // Every line inert (text.h): it may hold names, URLs and messages from the server.
  void log(const std::string& line) const {
    if (o.log) o.log(inert(line));
  }
  void add_progress(uint64_t n);
  std::string storage(const std::string& repo_id) const { return cache + "/" + repo_folder_name(repo_id, o.repo_type); }
};

// The hash the Hub vouches for a file's bytes (docs/integrity.md): the blob
// takes its final name only once its bytes match it.
enum class HashKind {
  kNone,     // the source offers none: written atomically, logged as not verified
  kSha256,   // an LFS file: X-Linked-Etag when it is one, else the tree's lfs.oid
  kGitSha1,  // a regular file: git's blob SHA-1 ("blob {size}\0" + bytes), the ETag or the tree's oid
};

// What a HEAD on resolve/{rev}/{file} (or the tree listing) tells of a file.
struct FileMeta {
  std::string repo_id, revision, path;  // for messages: the repository, the revision asked for, the file
  std::string etag, commit, location;   // etag: the blob's name in the cache (huggingface_hub's choice)
  uint64_t size = 0;
  bool cross_host = false;  // location is on another host: no token there
  HashKind hash = HashKind::kNone;
  std::string hash_hex;  // lower-case hex of `hash`
};

// Completes m's vouched hash from the tree listing's entry (lfs.oid, oid): an
// LFS file is checked against its SHA-256 whatever its ETag looks like (a
// mirror's MD5 or multipart ETag), a regular file against its git blob id.
// kCorruptData when the ETag is a hash the listing contradicts.
Status vouch_from_listing(FileMeta& m, const std::string& lfs_sha256, const std::string& git_oid);

// One blob being brought into {storage}/blobs/{etag}: huggingface_hub 2.x's
// process-unique partial file "{etag}.{8 hex}.incomplete" (an earlier run's
// partial is adopted and resumed: ours with the arrived ranges journalled in
// "{partial}.ranges", huggingface_hub's as the prefix it holds), filled by
// ranged GETs in chunks, hashed in order as chunks arrive, and renamed to its
// final name only once its bytes match the ETag. Thread-safe: any number of
// threads call claim()/fetch()/read() at once. The caller holds the blob's
// lock for the object's life.
class BlobFetch {
 public:
  struct Range {
    size_t first = 0, last = 0;  // chunk indices [first, last]
  };
  static Result<std::unique_ptr<BlobFetch>> open(HubCtx& c, const FileMeta& m, uint64_t chunk_bytes);
  ~BlobFetch();

  const FileMeta& meta() const { return m_; }
  uint64_t size() const { return m_.size; }
  // The next missing chunk (and, with `run`, every missing chunk after it up
  // to the next one that has arrived or is claimed): nullopt when none is left.
  std::optional<Range> claim(bool run);
  // Fetches a claimed range into the partial file; bytes falling into
  // [dst_offset, dst_offset + dst.size()) are also copied to dst.
  Status fetch(Range r, uint64_t dst_offset = 0, std::span<std::byte> dst = {});
  // Fills dst with bytes [offset, offset + dst.size()): copies what arrived,
  // waits for chunks another thread fetches, fetches missing ones itself.
  Status read(uint64_t offset, std::span<std::byte> dst);
  // As read(), without the copy: returns once bytes [offset, offset + n)
  // are in the partial file (fetching missing ones itself).
  Status arrive(uint64_t offset, uint64_t n);
  // The partial file (renamed to the blob once verified, same inode): a
  // private mapping whose view() of arrived bytes stays valid while held.
  // nullptr until a server holding the bytes confirmed the blob's size (the
  // file takes its full size only then: never a placeholder sized by a claim).
  std::shared_ptr<RandomAccessFile> partial() const {
    std::lock_guard lk(mu_);
    return in_;
  }
  // Blocks until every chunk arrived (or the fetch failed), then verifies and
  // renames the blob into place (once; later calls return the same status).
  Status finish();
  // Marks the fetch failed: waiters wake with `s`.
  void fail(Status s);
  bool failed() const;
  // Stops every request of this fetch (they return kCancelled); waiters wake.
  void cancel();

 private:
  struct Chunk {
    uint64_t begin = 0, end = 0, have = 0;  // have: bytes from begin that arrived
    bool claimed = false;
  };
  BlobFetch(HubCtx& c, FileMeta m);
  Status start(uint64_t chunk_bytes);
  void adopt_partial(const std::string& blobs, std::string* journal_path, uint64_t* size);
  Status create_partial(const std::string& blobs);
  // Gives the partial file its full size and maps it (once), after a server confirmed the size.
  Status size_partial_locked();
  // The check of a response to one of this blob's ranged GETs: its total size is the claimed one.
  Status check_response(const HttpResponse& r, uint64_t pos, uint64_t end, bool whole) const;
  Status save_journal_locked();
  void chunk_arrived_locked(size_t k, std::unique_lock<std::mutex>& lk);
  void advance_hash(std::unique_lock<std::mutex>& lk);
  Status copy_out(uint64_t offset, std::span<std::byte> dst) const;
  Status await_range(uint64_t offset, uint64_t n, std::span<std::byte> dst, bool copy);
  Status verify_and_commit();

  HubCtx& c_;
  FileMeta m_;
  std::string blob_, partial_, journal_;
  std::unique_ptr<WritableFile> out_, journal_out_;  // the partial file and its journal, opened once
  std::shared_ptr<RandomAccessFile> in_;             // the partial file, read back (hashing, copies)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Chunk> chunks_;
  size_t arrived_ = 0, hashed_ = 0;
  bool hashing_ = false, finished_ = false;
  bool adopted_ = false;  // an earlier run's partial file was resumed (kept on failure)
  std::atomic<bool> cancelled_{false};
  Status error_, final_;
  struct Hasher;
  std::unique_ptr<Hasher> hasher_;
};

// The blob of `m`, fetched under its lock by `connections` parallel ranged
// requests (one stream when the file is small); OK when it is already there.
Status fetch_blob(HubCtx& c, const FileMeta& m);
// HEAD {endpoint}/{repo}/resolve/{rev}/{file}.
Result<FileMeta> head_file(HubCtx& c, const std::string& repo_id, const std::string& revision, const std::string& file,
                           HttpResponse* error_response);
// snapshots/{commit}/{file} -> ../../blobs/{etag}.
Status link_pointer(HubCtx& c, const std::string& storage, const std::string& commit, const std::string& file,
                    const std::string& etag);
// The blob lock huggingface_hub takes: {cache}/.locks/{repo folder}/{etag}.lock.
std::string blob_lock_path(const HubCtx& c, const std::string& repo_id, const std::string& etag);

// snapshot_download split in two, for the streaming source: resolves the
// revision, lists the tree (huggingface_hub 2.x's trees/{commit}.json),
// downloads the files `now` selects, and returns the metadata of the other
// selected files still missing from the snapshot (not downloaded).
struct SnapshotPlan {
  std::string commit, folder;
  std::vector<FileMeta> deferred;
};
Result<SnapshotPlan> snapshot_download_except(const std::string& repo_id, const SnapshotOptions& s, const HubOptions& o,
                                              const std::function<bool(const std::string&)>& defer);

}  // namespace wl

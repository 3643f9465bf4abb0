// BlobFetch: one blob brought into the cache by ranged GETs, resumable,
// hashed in order as its chunks arrive, renamed into place once verified.
// Every write goes through the Env (so fault injection covers it).
#include <openssl/evp.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "hub/hub_internal.h"
#include "weightlift/hash.h"
#include "weightlift/lock.h"

namespace wl {

// SHA-256 (LFS files) or git blob SHA-1 (the others): the hash the Hub vouches for (FileMeta::hash).
struct BlobFetch::Hasher {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  HashKind kind = HashKind::kNone;
  Hasher(HashKind k, uint64_t size) : kind(k) {
    if (kind == HashKind::kSha256) EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    if (kind == HashKind::kGitSha1) {
      EVP_DigestInit_ex(ctx, EVP_sha1(), nullptr);
      std::string prefix = "blob " + std::to_string(size);
      EVP_DigestUpdate(ctx, prefix.data(), prefix.size() + 1);  // with the NUL
    }
  }
  ~Hasher() { EVP_MD_CTX_free(ctx); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void update(const void* p, size_t n) {
    if (kind != HashKind::kNone) EVP_DigestUpdate(ctx, p, n);
  }
  std::string hex() {
    if (kind == HashKind::kNone) return {};
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, md, &n);
    return fmt::format("{:02x}", fmt::join(md, md + n, ""));
  }
};

namespace {

std::string random_hex8() {
  static std::atomic<uint64_t> counter{0};
  std::mt19937_64 rng(std::random_device{}() ^ counter.fetch_add(1) ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return fmt::format("{:08x}", static_cast<uint32_t>(rng()));
}

constexpr std::string_view kJournalMagic = "weightlift-ranges 1";
constexpr uint64_t kJournalEvery = 1 << 20;  // bytes between journal saves within a chunk
// An attempt that delivered less than this (a trickling server, connections
// cut early) counts against the retry budget (retry.max_attempts in a row).
constexpr uint64_t kWeakProgress = uint64_t{64} << 10;

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9' || __builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, uint64_t(ch - '0'), &v))
      return false;
  }
  *out = v;
  return true;
}

// "{etag}.incomplete" (huggingface_hub 0.x) or "{etag}.{anything}.incomplete" (2.x, ours).
bool is_partial_of(const std::string& name, const std::string& etag) {
  return name.size() > etag.size() + 1 && name.compare(0, etag.size() + 1, etag + ".") == 0 &&
         name.ends_with(".incomplete");
}

}  // namespace

std::optional<uint64_t> free_disk_bytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return std::nullopt;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

std::string blob_lock_path(const HubCtx& c, const std::string& repo_id, const std::string& etag) {
  return c.cache + "/.locks/" + repo_folder_name(repo_id, c.o.repo_type) + "/" + etag + ".lock";
}

Result<std::unique_ptr<BlobFetch>> BlobFetch::open(HubCtx& c, const FileMeta& m, uint64_t chunk_bytes) {
  std::unique_ptr<BlobFetch> b(new BlobFetch(c, m));
  WL_RETURN_IF_ERROR(b->start(std::max<uint64_t>(chunk_bytes, 1)));
  return b;
}

BlobFetch::BlobFetch(HubCtx& c, FileMeta m) : c_(c), m_(std::move(m)) {}

BlobFetch::~BlobFetch() {
  if (out_) (void)out_->close();
  if (journal_out_) (void)journal_out_->close();
}

// Adopts an earlier run's partial file (the caller holds the blob lock, so
// nobody who honours it is writing one): sets partial_, out_, journal_out_
// and adopted_, and tells the journal to read ("" for a prefix) and the size.
void BlobFetch::adopt_partial(const std::string& blobs, std::string* journal_path, uint64_t* size) {
  Env* env = c_.env;
  // Ours carries a journal of arrived ranges; one without a journal was
  // written front to back (huggingface_hub in either naming, or our own
  // before its journal existed) and holds a prefix. Only a regular file of
  // this user is adopted (WriteOptions::adopt); a link or a neighbour's file
  // is left alone, and the caller makes a fresh partial file.
  struct Candidate {
    std::string name;
    bool journal;
    uint64_t size;
  };
  std::vector<Candidate> candidates;
  if (auto entries = env->list_dir(blobs); entries.ok()) {
    for (const auto& e : *entries)
      if (!e.is_dir && !e.is_symlink && is_partial_of(e.name, m_.etag))
        candidates.push_back({e.name, env->exists(blobs + "/" + e.name + ".ranges"), e.size});
    for (const auto& e : *entries)  // a journal of ours whose partial file is gone is stale
      if (e.name.ends_with(".incomplete.ranges") && is_partial_of(e.name.substr(0, e.name.size() - 7), m_.etag) &&
          !env->exists(blobs + "/" + e.name.substr(0, e.name.size() - 7)) &&
          env->new_writable(blobs + "/" + e.name, {.adopt = true}).ok())
        (void)env->remove(blobs + "/" + e.name);
  }
  // Journalled first, then the longest prefix.
  std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.journal != b.journal ? a.journal : a.size > b.size;
  });
  for (const auto& cand : candidates) {
    const std::string path = blobs + "/" + cand.name;
    auto file = env->new_writable(path, {.truncate = false, .adopt = true});
    std::unique_ptr<WritableFile> journal;
    if (file.ok()) {  // its journal, or a new one for a prefix
      auto j = cand.journal ? env->new_writable(path + ".ranges", {.truncate = false, .adopt = true})
                            : env->new_writable(path + ".ranges", {.mode = 0666, .exclusive = true});
      if (!j.ok()) file = j.status();
      if (j.ok()) journal = std::move(*j);
    }
    if (!file.ok()) {
      c_.log(fmt::format("leaving {} alone: {}", path, file.status().to_string()));
      continue;
    }
    partial_ = path;
    adopted_ = true;
    out_ = std::move(*file);
    journal_out_ = std::move(journal);
    *journal_path = cand.journal ? path + ".ranges" : "";
    *size = cand.size;
    return;
  }
}

// A fresh partial file and its journal, each O_CREAT|O_EXCL|O_NOFOLLOW with the
// umask's mode; a name taken meanwhile (or planted) is a new draw.
Status BlobFetch::create_partial(const std::string& blobs) {
  Env* env = c_.env;
  for (int attempt = 0; !out_; ++attempt) {
    Status taken;
    auto f = env->new_writable(partial_, {.mode = 0666, .exclusive = true});
    if (f.ok()) {
      auto j = env->new_writable(journal_, {.mode = 0666, .exclusive = true});
      if (j.ok()) {
        out_ = std::move(*f);
        journal_out_ = std::move(*j);
        break;
      }
      (void)(*f)->close();
      (void)env->remove(partial_);
      taken = j.status();
    } else {
      taken = f.status();
    }
    if (taken.code() != Code::kAlreadyExists || attempt >= 16) return taken;
    partial_ = blobs + "/" + m_.etag + "." + random_hex8() + ".incomplete";
    journal_ = partial_ + ".ranges";
  }
  return Status();
}

Status BlobFetch::start(uint64_t chunk_bytes) {
  Env* env = c_.env;
  const std::string blobs = c_.storage(m_.repo_id) + "/blobs";
  blob_ = blobs + "/" + m_.etag;
  WL_RETURN_IF_ERROR(env->create_dirs(blobs));
  std::string adopt_journal;
  uint64_t adopt_size = 0;
  adopt_partial(blobs, &adopt_journal, &adopt_size);
  const std::string adopt = adopted_ ? partial_ : "";
  if (!adopted_) partial_ = blobs + "/" + m_.etag + "." + random_hex8() + ".incomplete";
  journal_ = partial_ + ".ranges";
  // Admission: the claimed size (X-Linked-Size, Content-Length) must fit on the cache's disk before
  // anything is sized by it (the chunk table here, the partial file once a server confirms it).
  if (auto room = free_disk_bytes(blobs); room && m_.size > adopt_size && m_.size - adopt_size > *room)
    return Status::OutOfRange(fmt::format(
        "cannot download {} of {} (revision {}): the server says it is {} bytes, more than the {} bytes free on the "
        "cache's disk ({})",
        m_.path, m_.repo_id, m_.revision, m_.size, *room, blobs));

  // What an earlier run left: the journal's ranges, or a prefix.
  std::vector<std::pair<uint64_t, uint64_t>> arrived;
  if (!adopt.empty() && !adopt_journal.empty()) {
    auto text = read_file_to_string(adopt_journal, 16 << 20, env);
    std::istringstream in(text.ok() ? *text : std::string());
    std::string magic_line;
    std::getline(in, magic_line);
    std::string etag;
    uint64_t size = 0;
    if (magic_line == kJournalMagic && (in >> etag >> size) && etag == m_.etag && size == m_.size &&
        adopt_size == size) {
      uint64_t a = 0, b = 0;
      while (in >> a >> b)
        if (a < b && b <= m_.size) arrived.emplace_back(a, b);
    }
  } else if (!adopt.empty() && adopt_size <= m_.size && adopt_size > 0) {
    arrived.emplace_back(0, adopt_size);
  }
  // Chunks of chunk_bytes, cut also where an arrived range starts or ends, so
  // every arrived byte counts whatever chunk size the earlier run used.
  std::vector<uint64_t> cuts;
  for (uint64_t at = 0; at < m_.size; at += chunk_bytes) cuts.push_back(at);
  for (const auto& [a, b] : arrived) {
    cuts.push_back(a);
    if (b < m_.size) cuts.push_back(b);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  chunks_.resize(cuts.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    chunks_[i].begin = cuts[i];
    chunks_[i].end = i + 1 < cuts.size() ? cuts[i + 1] : m_.size;
  }
  for (const auto& [a, b] : arrived)  // bytes [a, b) arrived: whole chunks, since a and b are cut points
    for (size_t i = std::lower_bound(cuts.begin(), cuts.end(), a) - cuts.begin();
         i < chunks_.size() && chunks_[i].end <= b; ++i)
      chunks_[i].have = chunks_[i].end - chunks_[i].begin;
  for (auto& ch : chunks_)
    if (ch.have == ch.end - ch.begin) ++arrived_;
  hasher_ = std::make_unique<Hasher>(verify_downloads() ? m_.hash : HashKind::kNone, m_.size);
  // The journal exists before the partial file takes its full size: a partial
  // file without one is always a prefix. New files of ours are created
  // exclusively under unpredictable names, never through a link, with the
  // umask's mode (O_CREAT|O_EXCL|O_NOFOLLOW); a name taken meanwhile is a new draw.
  if (!out_) WL_RETURN_IF_ERROR(create_partial(blobs));
  WL_RETURN_IF_ERROR(save_journal_locked());
  WL_ASSIGN_OR_RETURN(uint64_t cur, out_->size());
  // A partial file of the full size was sized after a confirmation (or by huggingface_hub): map it now.
  // Otherwise it takes its size when the first response confirms it (size_partial_locked).
  if (cur == m_.size) {
    std::lock_guard lk(mu_);
    WL_RETURN_IF_ERROR(size_partial_locked());
  }
  uint64_t resumed = 0;
  for (auto& ch : chunks_) resumed += ch.have;
  if (resumed) c_.add_progress(resumed);
  return Status();
}

Status BlobFetch::size_partial_locked() {
  if (in_) return Status();
  WL_ASSIGN_OR_RETURN(uint64_t cur, out_->size());
  if (cur != m_.size) WL_RETURN_IF_ERROR(out_->truncate(m_.size));
  // Mapped (copy-on-write) as well as read: views of the bytes that arrived
  // are tensors without a copy (HubFile::view); reads still use pread.
  WL_ASSIGN_OR_RETURN(in_, c_.env->open(partial_, {.mode = FileMode::kMmapPrivate}));
  return Status();
}

Status BlobFetch::check_response(const HttpResponse& r, uint64_t pos, uint64_t end, bool whole) const {
  const std::string where = m_.location.substr(0, m_.location.find('?'));
  const std::string cr = r.header("content-range");  // "bytes a-b/total", or "bytes */total" (416)
  uint64_t total = 0;
  bool known = false;
  const auto slash = cr.rfind('/');
  if (r.status == 206 || r.status == 416)
    known = slash != std::string::npos && parse_u64(std::string_view(cr).substr(slash + 1), &total);
  else if (r.status == 200 && whole)
    known = parse_u64(r.header("content-length"), &total);
  else
    return Status();  // not a body this fetch takes (the caller reports it)
  // The size first: a server holding another size than the Hub claimed says more than a bad range.
  if (known && total != m_.size)
    return Status::Corrupt(fmt::format(
        "{} of {} (revision {}): the Hub says it is {} bytes (X-Linked-Size / Content-Length) but {} holds {} bytes",
        m_.path, m_.repo_id, m_.revision, m_.size, where, total));
  if (r.status != 206) return Status();
  const auto dash = cr.find('-');
  uint64_t a = 0, b = 0;
  if (!cr.starts_with("bytes ") || slash == std::string::npos || dash == std::string::npos || dash > slash ||
      !parse_u64(std::string_view(cr).substr(6, dash - 6), &a) ||
      !parse_u64(std::string_view(cr).substr(dash + 1, slash - dash - 1), &b) || a != pos || b + 1 != end)
    return Status::Corrupt(fmt::format("asked {} for bytes {}-{} of {}, it answered Content-Range '{}'", where, pos,
                                       end - 1, m_.path, cr.substr(0, 80)));
  return Status();
}

Status BlobFetch::save_journal_locked() {
  if (finished_) return Status();  // failed and cleaned up: nothing to resume
  std::string text = fmt::format("{}\n{} {}\n", kJournalMagic, m_.etag, m_.size);
  for (const auto& ch : chunks_)
    if (ch.have) text += fmt::format("{} {}\n", ch.begin, ch.begin + ch.have);
  // Rewritten in place through the descriptor opened once (never a path a
  // neighbour could swap), unsynced: a torn journal reads as "nothing
  // arrived", and the final hash check catches whatever a power loss could mix up.
  if (!journal_out_) return Status();
  WL_RETURN_IF_ERROR(journal_out_->truncate(0));
  return journal_out_->write_at(0, std::as_bytes(std::span(text.data(), text.size())));
}

std::optional<BlobFetch::Range> BlobFetch::claim(bool run) {
  std::lock_guard lk(mu_);
  if (!error_.ok()) return std::nullopt;
  for (size_t k = 0; k < chunks_.size(); ++k) {
    Chunk& ch = chunks_[k];
    if (ch.claimed || ch.have == ch.end - ch.begin) continue;
    ch.claimed = true;
    Range r{k, k};
    while (run && r.last + 1 < chunks_.size() && !chunks_[r.last + 1].claimed && chunks_[r.last + 1].have == 0)
      chunks_[++r.last].claimed = true;
    return r;
  }
  return std::nullopt;
}

void BlobFetch::chunk_arrived_locked(size_t k, std::unique_lock<std::mutex>& lk) {
  Chunk& ch = chunks_[k];
  ch.have = ch.end - ch.begin;
  ch.claimed = false;
  ++arrived_;
  Status s = save_journal_locked();
  // A body of unannounced length sizes the file only once every byte is there.
  if (s.ok() && !in_ && arrived_ == chunks_.size()) s = size_partial_locked();
  if (!s.ok() && error_.ok()) error_ = s;
  cv_.notify_all();
  advance_hash(lk);
}

// Hashes chunks in order as far as they have arrived (one thread at a time;
// the others leave it to the one hashing).
void BlobFetch::advance_hash(std::unique_lock<std::mutex>& lk) {
  if (hashing_) return;
  hashing_ = true;
  std::vector<std::byte> buf;
  while (in_ && hashed_ < chunks_.size() && chunks_[hashed_].have == chunks_[hashed_].end - chunks_[hashed_].begin &&
         error_.ok()) {
    const Chunk ch = chunks_[hashed_];
    lk.unlock();
    Status s;
    buf.resize(std::min<uint64_t>(ch.end - ch.begin, 4 << 20));
    for (uint64_t off = ch.begin; off < ch.end && s.ok();) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), ch.end - off));
      s = in_->read_at(off, std::span(buf.data(), len));
      if (s.ok()) hasher_->update(buf.data(), len);
      off += len;
    }
    lk.lock();
    if (!s.ok()) {
      if (error_.ok()) error_ = s;
      break;
    }
    ++hashed_;
  }
  hashing_ = false;
  cv_.notify_all();
}

Status BlobFetch::fetch(Range r, uint64_t dst_offset, std::span<std::byte> dst) {
  uint64_t pos, end;
  {
    std::lock_guard lk(mu_);
    pos = chunks_[r.first].begin + chunks_[r.first].have;
    end = chunks_[r.last].end;
  }
  size_t k = r.first;  // the chunk `pos` is in
  const std::string where = m_.location.substr(0, m_.location.find('?'));
  auto release = [&](Status s) {  // unclaims what did not arrive
    std::lock_guard lk(mu_);
    for (size_t i = k; i <= r.last; ++i) chunks_[i].claimed = false;
    cv_.notify_all();
    return s;
  };
  int stalls = 0;
  uint64_t saved = pos;
  std::chrono::steady_clock::time_point deadline{};  // request_timeout_s covers every resume of this range
  if (c_.http.options().request_timeout_s > 0)
    deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(c_.http.options().request_timeout_s));
  while (pos < end) {
    HttpRequest req;
    req.url = m_.location;
    req.headers = c_.headers(!m_.cross_host);
    req.deadline = deadline;
    const bool whole = pos == 0 && end == m_.size;
    if (!whole) {
      req.headers.emplace_back("Range", fmt::format("bytes={}-{}", pos, end - 1));
      req.expect_status = 206;
    }
    // Before the first byte is written: the server holding the bytes confirms the size the Hub claimed
    // (only then does the partial file take that size).
    req.on_response = [&, whole, at = pos](const HttpResponse& answer) -> Status {
      WL_RETURN_IF_ERROR(check_response(answer, at, end, whole));
      if (answer.status != 206 && !(whole && answer.status == 200 && answer.header("content-length").size()))
        return Status();
      std::lock_guard lk(mu_);
      return size_partial_locked();
    };
    BodySink sink = [&](std::span<const std::byte> d) -> Status {
      if (cancelled_) return Status::Cancelled("download stopped");
      if (pos + d.size() > end) return Status::Corrupt("the server sent more bytes than asked for from " + where);
      WL_RETURN_IF_ERROR(out_->write_at(pos, d));
      if (!dst.empty()) {  // the part that falls into the caller's buffer
        const uint64_t a = std::max(pos, dst_offset), b = std::min(pos + d.size(), dst_offset + dst.size());
        if (a < b) std::memcpy(dst.data() + (a - dst_offset), d.data() + (a - pos), static_cast<size_t>(b - a));
      }
      pos += d.size();
      c_.add_progress(d.size());
      std::unique_lock lk(mu_);
      while (k <= r.last && pos >= chunks_[k].end) {
        chunk_arrived_locked(k++, lk);
        saved = pos;
      }
      if (k <= r.last) {
        chunks_[k].have = pos - chunks_[k].begin;
        if (pos - saved >= kJournalEvery) {  // a killed process resumes within a MiB of where it was
          saved = pos;
          if (Status js = save_journal_locked(); !js.ok() && error_.ok()) error_ = js;
        }
      }
      return error_;
    };
    uint64_t delivered = 0;
    auto resp = c_.http.get(req, sink, &delivered);
    if (resp.ok() && resp->status < 300 && resp->status != (whole ? 200 : 206))
      return release(Status::Unavailable("the server ignored a Range request for " + where));
    if (resp.ok() && resp->status == 416) {  // past the end: the size the Hub claimed is not the blob's
      Status size = check_response(*resp, pos, end, whole);
      return release(size.ok() ? status_from_response(*resp, m_.location) : size);
    }
    if (resp.ok() && resp->status >= 300) return release(status_from_response(*resp, m_.location));
    if (pos >= end) break;
    if (!resp.ok()) {
      Status s = std::move(resp).status();
      // A local failure (disk full, cancelled) or a request that got nothing
      // after the client's own retries: give up. A body cut short: resume.
      if (s.code() != Code::kUnavailable || delivered == 0) return release(s);
    }
    if (delivered >= kWeakProgress)
      stalls = 0;
    else if (++stalls >= c_.http.options().retry.max_attempts)
      return release(Status::Unavailable(fmt::format(
          "download of {} stalled at byte {} of {}: {} attempts in a row delivered under {} KiB ({})", where, pos,
          m_.size, stalls, kWeakProgress >> 10, resp.ok() ? "cut short" : resp.status().message())));
    c_.log(fmt::format("connection dropped at byte {} of {}; resuming {}", pos, m_.path, where));
  }
  return release(Status());
}

Status BlobFetch::copy_out(uint64_t offset, std::span<std::byte> dst) const { return in_->read_at(offset, dst); }

Status BlobFetch::read(uint64_t offset, std::span<std::byte> dst) { return await_range(offset, dst.size(), dst, true); }

Status BlobFetch::arrive(uint64_t offset, uint64_t n) { return await_range(offset, n, {}, false); }

Status BlobFetch::await_range(uint64_t offset, uint64_t n, std::span<std::byte> dst, bool copy) {
  if (offset > m_.size || n > m_.size - offset)
    return Status::OutOfRange(fmt::format("read of {} bytes at offset {} past the end ({} bytes)", n, offset, m_.size));
  const uint64_t start = offset, end = offset + n;
  for (size_t k = 0; k < chunks_.size() && offset < end; ++k) {
    const uint64_t cb = chunks_[k].begin, ce = chunks_[k].end;
    if (ce <= offset) continue;
    const uint64_t a = offset, b = std::min(end, ce);
    auto part = copy ? dst.subspan(static_cast<size_t>(a - start), static_cast<size_t>(b - a)) : std::span<std::byte>();
    std::unique_lock lk(mu_);
    for (;;) {
      if (!error_.ok()) return error_;
      Chunk& ch = chunks_[k];
      if (ch.have == ce - cb || cb + ch.have >= b) {  // arrived (as far as this read needs)
        lk.unlock();
        if (copy) WL_RETURN_IF_ERROR(copy_out(a, part));
        break;
      }
      if (!ch.claimed) {  // nobody fetches it: fetch it here, straight into the caller's buffer too
        ch.claimed = true;
        const uint64_t had = cb + ch.have;
        lk.unlock();
        Status s = fetch({k, k}, a, part);
        if (!s.ok()) {
          fail(s);
          return s;
        }
        if (copy && had > a) WL_RETURN_IF_ERROR(copy_out(a, part.first(static_cast<size_t>(std::min(had, b) - a))));
        break;
      }
      cv_.wait(lk);
    }
    offset = b;
  }
  return Status();
}

void BlobFetch::fail(Status s) {
  std::lock_guard lk(mu_);
  if (error_.ok()) error_ = std::move(s);
  cv_.notify_all();
}

bool BlobFetch::failed() const {
  std::lock_guard lk(mu_);
  return !error_.ok();
}

void BlobFetch::cancel() {
  cancelled_ = true;
  fail(Status::Cancelled("download of " + m_.path + " stopped"));
}

Status BlobFetch::finish() {
  std::unique_lock lk(mu_);
  if (finished_) return final_;
  cv_.wait(lk, [&] { return !error_.ok() || arrived_ == chunks_.size(); });
  if (error_.ok()) advance_hash(lk);  // when every chunk was there from the start
  cv_.wait(lk, [&] { return !error_.ok() || (!hashing_ && hashed_ == chunks_.size()); });
  finished_ = true;
  if (!error_.ok() && !adopted_ && error_.code() != Code::kCancelled &&
      std::all_of(chunks_.begin(), chunks_.end(), [](const Chunk& ch) { return ch.have == 0; })) {
    // Nothing arrived (a refused size, an unreachable server): leave nothing behind. (A request
    // still in flight writes to the unlinked file at most.)
    (void)c_.env->remove(partial_);
    (void)c_.env->remove(journal_);
    journal_out_.reset();
  }
  if (error_.ok())
    final_ = verify_and_commit();
  else if (error_.code() == Code::kCancelled)
    final_ = error_;
  else  // name the repository, the file and the revision, not the partial file or a CDN URL
    final_ = Status(error_.code(), fmt::format("cannot download {} of {} (revision {}): {}", m_.path, m_.repo_id,
                                               m_.revision, error_.message()));
  if (!final_.ok() && error_.code() == Code::kIoError) final_.with_file(error_.file());  // the disk's failure: where
  cv_.notify_all();
  return final_;
}

Status BlobFetch::verify_and_commit() {
  Env* env = c_.env;
  const std::string got = hasher_->hex();
  if (hasher_->kind != HashKind::kNone && got != m_.hash_hex) {
    (void)out_->close();
    out_.reset();
    journal_out_.reset();
    (void)env->remove(partial_);
    (void)env->remove(journal_);
    const char* against = m_.hash_hex == m_.etag         ? "the ETag"
                          : m_.hash == HashKind::kSha256 ? "the tree listing's lfs.oid"
                                                         : "the tree listing's oid";
    return Status::Corrupt(
        fmt::format("downloaded bytes of {} in {} (revision {}) do not match {} {} (got {}); the partial "
                    "download was deleted",
                    m_.path, m_.repo_id, m_.revision, against, m_.hash_hex, got));
  }
  if (m_.hash != HashKind::kNone && hasher_->kind == HashKind::kNone)
    c_.log(fmt::format("warning: {} of {} (revision {}): NOT verified: verification is off (WEIGHTLIFT_VERIFY=0)",
                       m_.path, m_.repo_id, m_.revision));
  if (m_.hash == HashKind::kNone)
    c_.log(fmt::format(
        "warning: {} of {} (revision {}): the server vouches for no hash of it (ETag '{}', no lfs.oid or oid "
        "listed); written atomically but NOT verified",
        m_.path, m_.repo_id, m_.revision, m_.etag));
  WL_RETURN_IF_ERROR(out_->sync());
  WL_RETURN_IF_ERROR(out_->close());
  out_.reset();
  WL_RETURN_IF_ERROR(env->rename(partial_, blob_));
  journal_out_.reset();
  (void)env->remove(journal_);
  (void)env->sync_dir(parent_dir(blob_));
  return Status();
}

Status fetch_blob(HubCtx& c, const FileMeta& m) {
  Env* env = c.env;
  const std::string blob = c.storage(m.repo_id) + "/blobs/" + m.etag;
  if (blob_present(env, blob)) return Status();
  WL_RETURN_IF_ERROR(env->create_dirs(parent_dir(blob)));
  // Per-blob lock in .locks/, as huggingface_hub takes it (flock), so the two tools exclude each other.
  CrossProcessLock lock(blob_lock_path(c, m.repo_id, m.etag));
  WL_RETURN_IF_ERROR(lock.acquire());
  if (blob_present(env, blob)) return Status();  // another process (ours or huggingface_hub) finished it meanwhile
  const bool parallel = m.size >= c.o.parallel_min_bytes && c.o.connections_per_file > 1;
  const uint64_t chunk = std::max<uint64_t>(c.o.chunk_bytes, 1 << 20);
  Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {  // one fresh retry after a checksum mismatch
    WL_ASSIGN_OR_RETURN(auto bf, BlobFetch::open(c, m, chunk));
    auto worker = [&] {
      try {  // nothing thrown may leave a thread
        while (auto r = bf->claim(/*run=*/!parallel)) {
          Status st = bf->fetch(*r);
          if (!st.ok()) return bf->fail(std::move(st));
        }
      } catch (const std::exception& e) {
        bf->fail(Status::OutOfRange(std::string("out of memory: ") + e.what()));
      }
    };
    const uint64_t nchunks = (m.size + chunk - 1) / chunk;
    const int nthreads = parallel ? static_cast<int>(std::min<uint64_t>(c.o.connections_per_file, nchunks)) : 1;
    std::vector<std::thread> threads;
    for (int i = 1; i < nthreads; ++i) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    s = bf->finish();
    if (s.ok() || s.code() != Code::kCorruptData || attempt == 1) break;
    c.log(s.message() + "; downloading it again");
  }
  return s;
}

}  // namespace wl

// Ranged reads of remote objects (see remote_file.h).
#include "http/remote_file.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "util/checked.h"

namespace wl::remote {

namespace {

// A transfer that broke after delivering bytes is resumed from the first
// missing byte. An attempt that delivered less than kWeakProgress (a server
// trickling bytes, or cutting every connection early) counts against the
// client's retry budget (retry.max_attempts in a row); kMaxResumes bounds
// the rest.
constexpr int kMaxResumes = 1000;
constexpr uint64_t kWeakProgress = uint64_t{64} << 10;

bool parse_u64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

// "bytes FIRST-LAST/TOTAL" (TOTAL may be "*").
struct ContentRange {
  uint64_t first = 0, last = 0;
  std::optional<uint64_t> total;
};
std::optional<ContentRange> parse_content_range(std::string_view v) {
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  auto dash = v.find('-'), slash = v.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  ContentRange r;
  if (!parse_u64(v.substr(0, dash), &r.first) || !parse_u64(v.substr(dash + 1, slash - dash - 1), &r.last) ||
      r.last < r.first)
    return std::nullopt;
  std::string_view t = v.substr(slash + 1);
  if (t != "*") {
    uint64_t n = 0;
    if (!parse_u64(t, &n)) return std::nullopt;
    r.total = n;
  }
  return r;
}

HttpRequest with_header(HttpRequest r, std::string name, std::string value) {
  r.headers.emplace_back(std::move(name), std::move(value));
  return r;
}

}  // namespace

Status changed_since_planned(const std::string& name) {
  return Status::Aborted("the file changed since the load was planned (it was replaced or rewritten)").with_file(name);
}

Result<ObjectStat> stat_object(HttpClient& http, const ObjectTarget& target, const std::string& if_match) {
  WL_ASSIGN_OR_RETURN(HttpRequest head, target.request("HEAD"));
  if (!if_match.empty()) head = with_header(std::move(head), "If-Match", if_match);
  auto r = http.request(head);
  if (!r.ok()) return std::move(r).status().with_file(target.name());
  if (r->status == 412) return changed_since_planned(target.name());
  if (r->status >= 200 && r->status < 300) {
    ObjectStat st;
    if (!parse_u64(r->header("content-length"), &st.size))
      return Status::Unimplemented("the server does not tell the object's size (no Content-Length on HEAD)")
          .with_file(target.name());
    st.etag = r->header("etag");
    if (!if_match.empty() && st.etag != if_match) return changed_since_planned(target.name());
    st.vouched = target.vouched_hash(*r);
    return st;
  }
  // HEAD answers carry no body: ask once more with a GET for the reason.
  WL_ASSIGN_OR_RETURN(HttpRequest get, target.request("GET"));
  get = with_header(std::move(get), "Range", "bytes=0-0");
  get.max_body_bytes = 64 * 1024;
  auto g = http.request(get);
  if (g.ok() && g->status == r->status && !g->body.empty()) return target.error(*g);
  return target.error(*r);
}

Status read_object_range(HttpClient& http, const ObjectTarget& target, const std::string& version, uint64_t object_size,
                         uint64_t offset, std::span<const std::span<std::byte>> parts) {
  uint64_t total = 0;
  for (auto p : parts) {
    if (!checked_add(total, static_cast<uint64_t>(p.size()), &total))
      return Status::InvalidArgument("read size overflows").with_file(target.name());
  }
  uint64_t end = 0;
  if (!checked_add(offset, total, &end) || end > object_size)
    return Status::OutOfRange(fmt::format("read of {} bytes at offset {} is past the end of the object ({} bytes)",
                                          total, offset, object_size))
        .with_file(target.name());
  if (total == 0) return Status();

  uint64_t done = 0;  // bytes placed into parts
  size_t part = 0;    // where the next byte goes
  uint64_t in_part = 0;
  while (part < parts.size() && parts[part].empty()) ++part;
  const auto started = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point deadline{};  // request_timeout_s covers every resume of this read
  if (http.options().request_timeout_s > 0)
    deadline = started + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(http.options().request_timeout_s));
  int weak = 0;  // attempts in a row that delivered under kWeakProgress
  for (int resumes = 0;; ++resumes) {
    const uint64_t first = offset + done, last = end - 1;
    WL_ASSIGN_OR_RETURN(HttpRequest req, target.request("GET"));
    req.deadline = deadline;
    req.headers.emplace_back("Range", fmt::format("bytes={}-{}", first, last));
    if (!version.empty()) req.headers.emplace_back("If-Match", version);
    uint64_t skip = 0;    // bytes of a 200 (whole object) answer before `first`
    bool enough = false;  // a 200 answer: stop it once the range is in
    Status body_error;
    req.on_response = [&](const HttpResponse& r) -> Status {
      const std::string cl = r.header("content-length");
      uint64_t len = 0;
      const bool has_len = parse_u64(cl, &len);
      if (r.status == 206) {
        auto cr = parse_content_range(r.header("content-range"));
        if (!cr || cr->first != first || cr->last != last || (cr->total && *cr->total != object_size) ||
            (has_len && len != last - first + 1))
          return Status::Corrupt(
                     fmt::format(
                         "asked for bytes {}-{} of a {}-byte object, the server answered Content-Range '{}' with "
                         "Content-Length '{}'",
                         first, last, object_size, r.header("content-range"), cl))
              .with_file(target.name());
        skip = 0;
        enough = false;
        return Status();
      }
      if (r.status == 200) {  // the Range was ignored: the whole object follows
        if (has_len && len != object_size)
          return Status::Corrupt(
                     fmt::format("the object is {} bytes but the server sent a {}-byte body", object_size, len))
              .with_file(target.name());
        skip = first;
        enough = true;
        return Status();
      }
      return Status::Corrupt(fmt::format("unexpected HTTP {} to a Range request", r.status)).with_file(target.name());
    };
    auto sink = [&](std::span<const std::byte> data) -> Status {
      if (skip > 0) {
        uint64_t s = std::min<uint64_t>(skip, data.size());
        skip -= s;
        data = data.subspan(static_cast<size_t>(s));
      }
      while (!data.empty()) {
        if (done == total) {
          if (enough) return Status::Cancelled("enough");  // a 200 answer: the rest is not needed
          body_error = Status::Corrupt(fmt::format("the server sent more than the {} bytes of range {}-{}",
                                                   last - first + 1, first, last))
                           .with_file(target.name());
          return body_error;
        }
        std::span<std::byte> dst = parts[part].subspan(static_cast<size_t>(in_part));
        size_t n = std::min(dst.size(), data.size());
        std::memcpy(dst.data(), data.data(), n);
        data = data.subspan(n);
        done += n;
        in_part += n;
        while (part < parts.size() && in_part == parts[part].size()) ++part, in_part = 0;
      }
      return Status();
    };
    const uint64_t before = done;
    uint64_t delivered = 0;
    auto r = http.get(req, sink, &delivered);
    if (!body_error.ok()) return body_error;
    if (!r.ok()) {
      if (done == total && r.status().code() == Code::kCancelled) return Status();  // stopped a 200 answer
      // A broken transfer that made progress resumes from the first missing byte.
      if (r.status().code() == Code::kUnavailable && done > before) {
        weak = done - before < kWeakProgress ? weak + 1 : 0;
        if (weak < http.options().retry.max_attempts && resumes < kMaxResumes) continue;
        return Status::Unavailable(
                   fmt::format("giving up on bytes {}-{} at byte {} after {} resumed attempts in {:.1f} s ({} in a "
                               "row delivered under {} KiB): {}",
                               offset, end - 1, offset + done, resumes + 1,
                               std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), weak,
                               kWeakProgress >> 10, r.status().message()))
            .with_file(target.name());
      }
      return std::move(r).status().with_file(target.name());
    }
    if (r->status == 412) return changed_since_planned(target.name());
    if (r->status < 200 || r->status >= 300) return target.error(*r);
    if (done == total) return Status();
    return Status::Corrupt(fmt::format("the server's body ended after {} of the {} bytes of range {}-{}", done - before,
                                       last - first + 1, first, last))
        .with_file(target.name());
  }
}

Status RemoteFile::fill_head() const {
  // Called with head_mu_ held.
  if (head_ready_) return Status();
  std::string buf(static_cast<size_t>(std::min(stat_.size, kHeadBytes)), '\0');
  std::span<std::byte> whole = std::as_writable_bytes(std::span(buf.data(), buf.size()));
  std::span<std::byte> one[] = {whole};
  WL_RETURN_IF_ERROR(read_object_range(*http_, *target_, stat_.etag, stat_.size, 0, one));
  head_ = std::move(buf);
  head_ready_ = true;
  return Status();
}

Status RemoteFile::read_at(uint64_t offset, std::span<std::byte> dst) const {
  std::span<std::byte> one[] = {dst};
  return read_scatter_at(offset, one);
}

Status RemoteFile::read_scatter_at(uint64_t offset, std::span<const std::span<std::byte>> parts) const {
  uint64_t total = 0;
  for (auto p : parts) total += p.size();
  uint64_t end = 0;
  const bool in_head = checked_add(offset, total, &end) && end <= std::min(stat_.size, kHeadBytes) && total > 0;
  if (in_head) {
    std::lock_guard lk(head_mu_);
    WL_RETURN_IF_ERROR(fill_head());
    uint64_t at = offset;
    for (auto p : parts) {
      if (!p.empty()) std::memcpy(p.data(), head_.data() + at, p.size());
      at += p.size();
    }
    return Status();
  }
  return read_object_range(*http_, *target_, stat_.etag, stat_.size, offset, parts);
}

Result<std::shared_ptr<RandomAccessFile>> open_remote(std::shared_ptr<HttpClient> http,
                                                      std::shared_ptr<const ObjectTarget> target,
                                                      const OpenOptions& options) {
  WL_ASSIGN_OR_RETURN(ObjectStat st, stat_object(*http, *target, options.expect_version));
  return std::shared_ptr<RandomAccessFile>(
      std::make_shared<RemoteFile>(std::move(http), std::move(target), std::move(st)));
}

}  // namespace wl::remote

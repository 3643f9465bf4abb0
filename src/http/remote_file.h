// Private: a RandomAccessFile over an object reached by HTTP ranged GETs,
// shared by the http(s):// source (http_env.cpp) and the S3 source (src/s3/).
//
// What the source says: how to build a request for the object (URL,
// headers, signing) and what an error response means. What this file does:
// size and version from a HEAD, ranged GETs straight into the caller's
// memory (several buffers filled by one GET when they are contiguous in the
// object), resuming a transfer that broke from the byte where it stopped,
// a 200 answer to a Range request (the server ignored the range), bodies
// whose length disagrees with the range asked, If-Match on the version.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "weightlift/http.h"
#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl::remote {

// How one object is reached. Thread-safe (const).
class ObjectTarget {
 public:
  virtual ~ObjectTarget() = default;
  // The URL shown in messages ("s3://bucket/key", "https://host/path"), no credentials.
  virtual const std::string& name() const = 0;
  // A request for the object: method "GET" or "HEAD", signed as the source needs.
  virtual Result<HttpRequest> request(const std::string& method) const = 0;
  // The Status of a final non-2xx response (body may be empty), naming name().
  virtual Status error(const HttpResponse& r) const = 0;
  // The whole object's hash the store vouches for in a HEAD's answer; none by default (plain URLs).
  virtual std::optional<VouchedHash> vouched_hash(const HttpResponse& head) const {
    (void)head;
    return std::nullopt;
  }
};

struct ObjectStat {
  uint64_t size = 0;
  std::string etag;  // as the server sent it (quotes kept); "" when it sent none
  std::optional<VouchedHash> vouched;
};

// HEAD of the object; with a non-empty `if_match`, a different version is
// kAborted. A failed HEAD is asked again as a one-byte GET so that the error
// body (S3's XML) can say why.
Result<ObjectStat> stat_object(HttpClient& http, const ObjectTarget& target, const std::string& if_match = {});

// Reads [offset, offset + sum of parts) of the object into `parts` in order,
// all or error. `version` non-empty: sent as If-Match (412 -> kAborted).
// `object_size`: checked against what the server says in Content-Range.
Status read_object_range(HttpClient& http, const ObjectTarget& target, const std::string& version, uint64_t object_size,
                         uint64_t offset, std::span<const std::span<std::byte>> parts);

// The file of one version of an object (see io.h for the contract).
class RemoteFile final : public RandomAccessFile {
 public:
  RemoteFile(std::shared_ptr<HttpClient> http, std::shared_ptr<const ObjectTarget> target, ObjectStat stat)
      : http_(std::move(http)), target_(std::move(target)), stat_(std::move(stat)) {}
  const std::string& path() const override { return target_->name(); }
  uint64_t size() const override { return stat_.size; }
  std::string version() const override { return stat_.etag; }
  bool is_remote() const override { return true; }
  std::optional<VouchedHash> vouched_hash() const override { return stat_.vouched; }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override;
  Status read_scatter_at(uint64_t offset, std::span<const std::span<std::byte>> parts) const override;

 private:
  // Small reads near the start (format headers) are served from one GET of
  // the first kHeadBytes, fetched once.
  static constexpr uint64_t kHeadBytes = 64 * 1024;
  Status fill_head() const;

  std::shared_ptr<HttpClient> http_;
  std::shared_ptr<const ObjectTarget> target_;
  ObjectStat stat_;
  mutable std::mutex head_mu_;
  mutable bool head_ready_ = false;
  mutable std::string head_;
};

// Opens the object: stat_object() with options.expect_version (mode and
// populate do not apply to a remote object and are ignored).
Result<std::shared_ptr<RandomAccessFile>> open_remote(std::shared_ptr<HttpClient> http,
                                                      std::shared_ptr<const ObjectTarget> target,
                                                      const OpenOptions& options);

// The message of an object replaced since it was planned (as for local files).
Status changed_since_planned(const std::string& name);

// The http:// and https:// source: ranged GETs of plain URLs (no listing).
// Without options, HttpOptions() (the WEIGHTLIFT_* variables) as they are
// when a file is opened.
std::unique_ptr<Env> new_http_env(std::optional<HttpOptions> options = std::nullopt);

// The environment variables HttpOptions() reads (a source built from them
// builds its client again when one changes).
const std::vector<std::string>& network_setting_variables();
// Their current values, as one string to compare.
std::string network_settings_fingerprint();

}  // namespace wl::remote

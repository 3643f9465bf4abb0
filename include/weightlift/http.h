// weightlift/http.h: a small HTTP client on libcurl for the Hub downloader and
// the remote sources (http(s):// ranged reads, s3:// and gs:// objects).
//
// What it does for every request: connection reuse (a pool of curl handles,
// each keeping its own connections alive), HTTP/2 over TLS where the server
// offers it (HTTP/1.1 otherwise), timeouts (connect, and a stall timeout: a
// transfer slower than 1 KiB/s for `stall_timeout_s` is aborted), and retries
// with exponential backoff plus jitter on connection errors, 429 and 5xx,
// honouring Retry-After (capped). Redirects are followed by this class, not by
// curl, so that the Authorization header is dropped as soon as a redirect
// leaves the scheme+host+port of the original URL (a CDN never sees the token).
//
// Thread-safety: an HttpClient may be used from many threads at once.
// Tokens: header values are never logged; error messages carry URLs only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "weightlift/status.h"

namespace wl {

struct RetryPolicy {
  int max_attempts = 5;        // total tries for one request (>= 1)
  double base_delay_s = 0.25;  // delay before retry k is base * 2^k, +-50% jitter
  double max_delay_s = 8.0;    // cap for the computed delay and for Retry-After
};

struct HttpOptions {
  std::string user_agent = "weightlift/0.1";
  double connect_timeout_s = 10;
  double stall_timeout_s = 30;  // abort when < 1 KiB/s for this long
  int max_redirects = 10;
  RetryPolicy retry;
  // Certificate bundle for TLS (CURLOPT_CAINFO); "" = the system's.
  std::string ca_bundle;
};

// AWS Signature Version 4, computed by libcurl (CURLOPT_AWS_SIGV4) over the
// method, path, query and every header of the request. The caller adds the
// headers the service wants signed (S3: x-amz-content-sha256, and
// x-amz-security-token for temporary credentials). Query parameters must be
// sorted by name and percent-encoded (libcurl signs the query as given).
struct AwsSigV4 {
  std::string provider;  // "aws:amz:<region>:<service>", e.g. "aws:amz:us-east-1:s3"
  std::string access_key_id;
  std::string secret_access_key;
};

struct HttpResponse;

struct HttpRequest {
  std::string method = "GET";  // GET or HEAD
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. {"Authorization", "Bearer ..."}
  bool follow_redirects = true;
  // With follow_redirects=false, relative redirects (same host: a renamed repo)
  // are still followed, as huggingface_hub's HEAD does; absolute ones are
  // returned to the caller (status 3xx with a `location` header).
  bool follow_relative_redirects = true;
  uint64_t max_body_bytes = 64ull << 20;  // buffered bodies larger than this fail
  // Streamed GET only: when nonzero, a 2xx response with another status (a 200
  // to a Range request) is not fed to the sink; the transfer stops and the
  // response is returned for the caller to decide.
  long expect_status = 0;
  // Sign the request (see AwsSigV4); nullopt sends it unsigned.
  std::optional<AwsSigV4> sigv4;
  // Streamed GET only: called with the status and headers of a 2xx response
  // before its first body byte reaches the sink (also for an empty body); a
  // non-OK status aborts the transfer and is returned.
  std::function<Status(const HttpResponse&)> on_response;
};

struct HttpResponse {
  long status = 0;
  std::string url;                             // final URL after redirects
  std::map<std::string, std::string> headers;  // names lower-cased; last value wins
  std::string body;                            // empty for streamed responses
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Receives body bytes of a streamed GET; returning a non-OK status aborts.
using BodySink = std::function<Status(std::span<const std::byte>)>;

// What the Hub's error headers say (huggingface_hub's typed errors).
enum class HubErrorKind { kNone, kRepoNotFound, kGated, kRevisionNotFound, kEntryNotFound, kDisabled, kOther };
HubErrorKind classify_hub_error(const HttpResponse& r);
// A Status for a non-2xx response naming the URL and the Hub's error:
// repo/revision/entry not found -> kNotFound, gated/disabled/401/403 ->
// kPermissionDenied, 429/5xx -> kUnavailable, others kInvalidArgument.
Status status_from_response(const HttpResponse& r, const std::string& url);

// "scheme://host:port" of a URL (lower-cased, default ports filled in).
std::string url_origin(const std::string& url);
// Percent-encodes everything but unreserved characters; keeps '/' when keep_slash.
std::string url_quote(const std::string& s, bool keep_slash);

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // A buffered request, with retries. Any final status (including 4xx) is
  // returned as a response; only transport failures (after retries) and
  // 429/5xx that outlast the retries are errors (kUnavailable).
  Result<HttpResponse> request(const HttpRequest& req);

  // A streamed GET: 2xx bodies go to `sink`. Retries (connection errors,
  // 429, 5xx) happen only while no body byte has reached the sink; a failure
  // after that is returned (kUnavailable) with *delivered set, so the caller
  // can resume with a Range request. Non-2xx final responses are returned as
  // responses (the sink sees nothing).
  Result<HttpResponse> get(const HttpRequest& req, const BodySink& sink, uint64_t* delivered = nullptr);

  const HttpOptions& options() const { return options_; }

 private:
  struct Pool;
  Result<HttpResponse> perform_once(const HttpRequest& req, const std::string& url, bool send_auth,
                                    const BodySink* sink, uint64_t* delivered, bool* transport_error);
  Result<HttpResponse> run(const HttpRequest& req, const BodySink* sink, uint64_t* delivered);
  HttpOptions options_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace wl

// weightlift/http.h: a small HTTP client on libcurl for the Hub downloader and
// the remote sources (http(s):// ranged reads, s3:// and gs:// objects), and
// the network policy every one of their requests follows.
//
// The policy, in this one place (every request of the code base goes through
// HttpClient):
//   schemes     only http and https, for the first URL and every redirect
//               (libcurl's CURLOPT_PROTOCOLS_STR and CURLOPT_REDIR_PROTOCOLS_STR,
//               and a check before a redirect is followed): a Location of
//               file://, ftp://, gopher://, dict://... is refused, never opened
//   redirects   followed by this class, not by curl, at most max_redirects; the
//               Authorization (and x-amz-security-token) header and the SigV4
//               signature are dropped for good as soon as a redirect leaves the
//               scheme+host+port of the original URL (a CDN never sees the token)
//   bounds      response headers (max_header_bytes), buffered bodies
//               (HttpRequest::max_body_bytes: a Content-Length past it is
//               refused at the end of the headers, a body without one when it
//               gets there), error bodies (max_error_body_bytes: kept for the
//               message, the rest not read); no Content-Encoding is decoded.
//               (Not CURLOPT_MAXFILESIZE: it would drop an error's body, and
//               with it the server's reason.) Streamed bodies are bounded by
//               their sinks (the range or size asked for).
//   timeouts    connect, stall (a transfer slower than 1 KiB/s for
//               stall_timeout_s is aborted), an optional deadline per request
//               (request_timeout_s, HttpRequest::deadline) and per process scope
//               (ScopedNetworkDeadline: the CLI's --deadline)
//   retries     exponential backoff plus jitter on connection errors, 429 and
//               5xx, honouring Retry-After (capped); a host that failed every
//               attempt of a request without answering is not tried again for
//               dead_host_window_s (the next requests fail at once, naming it)
//   messages    a failure names the method, the URL (query stripped, userinfo
//               shown as ***, made inert: text.h), the attempts made and the
//               time spent, and the settings that apply
//   the wire    a request whose URL or any header (name or value) holds a
//               control character (CR/LF: an injected header) is refused with
//               kInvalidArgument naming the header, never its value, before
//               anything is sent; so is a redirect to such a URL
//
// Settings from the environment (read by HttpOptions' constructor; the CLI's
// flags of the same names set them): WEIGHTLIFT_CONNECT_TIMEOUT,
// WEIGHTLIFT_STALL_TIMEOUT, WEIGHTLIFT_REQUEST_TIMEOUT (seconds),
// WEIGHTLIFT_RETRIES, WEIGHTLIFT_MAX_REDIRECTS, WEIGHTLIFT_LIST_MAX_PAGES,
// WEIGHTLIFT_LIST_MAX_ENTRIES (counts). docs/reliability.md lists them.
//
// Thread-safety: an HttpClient may be used from many threads at once.

// Tokens: header values are never logged; error messages carry URLs only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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
  // The defaults below, then the WEIGHTLIFT_* variables of the environment
  // (see the top of this file). A variable that does not parse keeps its
  // default and sets `invalid`: every request of a client built from these
  // options then fails with that message.
  HttpOptions();

  std::string user_agent = "weightlift/0.1";
  double connect_timeout_s = 10;  // WEIGHTLIFT_CONNECT_TIMEOUT
  double stall_timeout_s = 10;    // WEIGHTLIFT_STALL_TIMEOUT: abort when < 1 KiB/s for this long (whole seconds, >= 1)
  double request_timeout_s = 0;   // WEIGHTLIFT_REQUEST_TIMEOUT: one request, all its attempts and resumes; 0 = none
  int max_redirects = 10;         // WEIGHTLIFT_MAX_REDIRECTS
  RetryPolicy retry;              // WEIGHTLIFT_RETRIES = retry.max_attempts - 1
  uint64_t max_header_bytes = uint64_t{256} << 10;     // all header lines of one response
  uint64_t max_error_body_bytes = uint64_t{64} << 10;  // a non-2xx body kept for the message
  // Listings (S3 ListObjectsV2 pages, Hub tree pages): a listing that needs
  // more pages, holds more entries or takes longer is an error naming the
  // cap. Pages hold up to 1,000 entries on S3 and the Hub, so 1,000 pages
  // cover the entry cap; a listing of a real repository (thousands of files)
  // takes a few pages and seconds. list_timeout_s bounds one listing, every
  // page and retry included, so an endless one stops within a minute.
  uint64_t max_list_pages = 1000;       // WEIGHTLIFT_LIST_MAX_PAGES
  uint64_t max_list_entries = 1000000;  // WEIGHTLIFT_LIST_MAX_ENTRIES
  double list_timeout_s = 60;           // WEIGHTLIFT_LIST_TIMEOUT; 0 = none
  // After a request failed every attempt without any answer from its host
  // (refused, unreachable, silent), requests to that host fail at once for
  // this long (process-wide, naming the first failure); 0 turns it off for
  // the requests of this client (they neither mark nor skip a host).
  double dead_host_window_s = 30;
  // Certificate bundle for TLS (CURLOPT_CAINFO); "" = the system's.
  std::string ca_bundle;
  std::string invalid;  // see the constructor
};

// A deadline for every request the process makes while the object lives
// (the CLI's --deadline / WEIGHTLIFT_DEADLINE: one command). Nested scopes
// keep the earliest deadline. `setting` names it in messages.
class ScopedNetworkDeadline {
 public:
  explicit ScopedNetworkDeadline(double seconds, std::string setting = "--deadline");
  ~ScopedNetworkDeadline();
  ScopedNetworkDeadline(const ScopedNetworkDeadline&) = delete;
  ScopedNetworkDeadline& operator=(const ScopedNetworkDeadline&) = delete;

 private:
  int64_t previous_ns_;
  std::string previous_setting_;
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

// The deadline of one listing (HttpOptions::list_timeout_s from now; the
// zero time point, "none", when it is 0), and the error once it passed.
std::chrono::steady_clock::time_point listing_deadline(const HttpOptions& o);
Status listing_overdue(const HttpOptions& o, std::chrono::steady_clock::time_point deadline, const std::string& what,
                       uint64_t pages, uint64_t entries);

struct HttpRequest {
  std::string method = "GET";  // GET or HEAD
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. {"Authorization", "Bearer ..."}
  bool follow_redirects = true;
  // With follow_redirects=false, relative redirects (same host: a renamed repo)
  // are still followed, as huggingface_hub's HEAD does; absolute ones are
  // returned to the caller (status 3xx with a `location` header).
  bool follow_relative_redirects = true;
  // Buffered 2xx bodies larger than this fail (kOutOfRange) without being
  // read past it: JSON and XML documents, listings.
  uint64_t max_body_bytes = 16ull << 20;
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
  // When set, the request (every attempt, backoff included) ends by then
  // (kUnavailable naming the deadline), besides options.request_timeout_s.
  std::chrono::steady_clock::time_point deadline{};
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

// kInvalidArgument when a secret to be sent in a header (a token, a key, a
// password) holds a control character or bytes that are not UTF-8 (text.h's
// has_control_chars): the message names where it came from (`source`:
// "HF_TOKEN", "the token file /root/.cache/huggingface/token", "--token") and
// never its value. Every source of credentials calls it as it reads them.
Status check_secret(std::string_view secret, std::string_view source);

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
  struct Attempt;
  Result<HttpResponse> perform_once(const HttpRequest& req, const std::string& url, bool send_auth,
                                    const BodySink* sink, Attempt* attempt);
  Result<HttpResponse> run(const HttpRequest& req, const BodySink* sink, uint64_t* delivered);
  HttpOptions options_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace wl

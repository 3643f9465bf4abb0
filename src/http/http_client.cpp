// libcurl-backed HttpClient (see include/weightlift/http.h).
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "http/ca_bundle.h"
#include "weightlift/http.h"
#include "weightlift/text.h"

namespace wl {
namespace {

std::once_flag g_curl_once;

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

// URLs in messages lose their query (signed CDN URLs carry credentials there)
// and their userinfo (http://user:password@host); inert() escapes the rest.
std::string redact(const std::string& url) { return inert(url.substr(0, url.find('?'))); }

// A request that would put a control character on the wire (a header that
// splits in two, a URL that is not one) is refused before it is sent; the
// header's value is never shown (it may be a credential).
Status check_request_text(const HttpRequest& req, const std::string& url) {
  if (has_control_chars(url) || url.find(' ') != std::string::npos)
    return Status::InvalidArgument("refusing a URL that holds a space or a control character: " + redact(url));
  for (const auto& [k, v] : req.headers)
    if (has_control_chars(k) || has_control_chars(v))
      return Status::InvalidArgument(
          fmt::format("refusing to send the header '{}' to {}: it holds a control character (its value is not shown)",
                      k, redact(url)));
  return Status();
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "5 s", "0.5 s", "none"
std::string secs(double s) { return s > 0 ? fmt::format("{:g} s", s) : std::string("none"); }

bool http_scheme(const std::string& url) {
  auto e = url.find("://");
  if (e == std::string::npos) return false;
  std::string scheme = lower(url.substr(0, e));
  return scheme == "http" || scheme == "https";
}

// The scheme of a URL, printable and short, for messages.
std::string scheme_of(const std::string& url) {
  auto e = url.find(':');
  std::string s = lower(url.substr(0, std::min<size_t>(e == std::string::npos ? url.size() : e, 32)));
  for (auto& c : s)
    if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
  return s;
}

// ---- settings from the environment ----

bool parse_seconds(const char* text, double* out) {
  std::string_view v(text);
  double d = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(d) || d < 0 || d > 7 * 24 * 3600) return false;
  *out = d;
  return true;
}

bool parse_count(const char* text, uint64_t max, uint64_t* out) {
  std::string_view v(text);
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || p != v.data() + v.size() || n > max) return false;
  *out = n;
  return true;
}

// ---- the process-wide deadline (ScopedNetworkDeadline) ----

std::atomic<int64_t> g_deadline_ns{0};  // steady_clock nanoseconds since its epoch; 0 = none
std::mutex g_deadline_mu;
std::string g_deadline_setting;

Clock::time_point process_deadline(std::string* setting) {
  int64_t ns = g_deadline_ns.load();
  if (ns == 0) return {};
  std::lock_guard lk(g_deadline_mu);
  *setting = g_deadline_setting;
  return Clock::time_point(std::chrono::nanoseconds(ns));
}

// ---- hosts that did not answer (HttpOptions::dead_host_window_s) ----

struct DeadHost {
  Clock::time_point since, until;
  std::string why;
};
std::mutex g_dead_mu;
std::map<std::string, DeadHost> g_dead;

std::optional<DeadHost> dead_host(const std::string& origin) {
  std::lock_guard lk(g_dead_mu);
  auto it = g_dead.find(origin);
  if (it == g_dead.end()) return std::nullopt;
  if (Clock::now() >= it->second.until) {
    g_dead.erase(it);
    return std::nullopt;
  }
  return it->second;
}
void mark_dead(const std::string& origin, double window_s, std::string why) {
  if (window_s <= 0) return;
  std::lock_guard lk(g_dead_mu);
  if (g_dead.size() > 1024) g_dead.clear();
  auto now = Clock::now();
  g_dead[origin] = DeadHost{
      now, now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(window_s)), std::move(why)};
}
void mark_alive(const std::string& origin) {
  std::lock_guard lk(g_dead_mu);
  g_dead.erase(origin);
}

double jittered_backoff(const RetryPolicy& p, int attempt) {
  thread_local std::mt19937 rng{std::random_device{}()};
  double d = p.base_delay_s * static_cast<double>(1u << std::min(attempt, 16));
  d = std::min(d, p.max_delay_s);
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  return std::min(d * jitter(rng), p.max_delay_s);
}

void sleep_s(double s) {
  if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

bool retryable_status(long s) { return s == 429 || (s >= 500 && s <= 599); }

struct Transfer {
  HttpResponse* resp = nullptr;
  const BodySink* sink = nullptr;
  uint64_t delivered = 0;
  uint64_t max_body = 0;
  uint64_t max_error_body = 0;
  uint64_t header_bytes = 0, max_header = 0;
  Status sink_status;
  bool too_large = false;
  bool headers_too_large = false;
  bool error_body_cut = false;  // a non-2xx body past max_error_body: the transfer stopped there
  bool head = false;            // a HEAD: its Content-Length describes a body that never comes
  long expect = 0;
  bool unexpected = false;
  const std::function<Status(const HttpResponse&)>* on_response = nullptr;
  bool response_seen = false;
  bool in_2xx() const { return resp->status >= 200 && resp->status < 300; }
  // The caller's look at a 2xx response before its body (once).
  bool check_response() {
    if (response_seen || on_response == nullptr || !*on_response) return true;
    response_seen = true;
    Status s = (*on_response)(*resp);
    if (!s.ok()) sink_status = std::move(s);
    return sink_status.ok();
  }
};

size_t on_header_impl(Transfer* t, char* data, size_t len) {
  t->header_bytes += len;
  if (t->header_bytes > t->max_header) {
    t->headers_too_large = true;
    return 0;  // aborts the transfer
  }
  std::string_view line(data, len);
  if ((line == "\r\n" || line == "\n") && t->sink == nullptr && !t->head && t->in_2xx()) {
    // End of a buffered 2xx response's headers: a body announced past the bound is refused before it is read.
    const std::string cl = t->resp->header("content-length");
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(cl.data(), cl.data() + cl.size(), n);
    if (!cl.empty() && ec == std::errc() && p == cl.data() + cl.size() && n > t->max_body) {
      t->too_large = true;
      return 0;
    }
  }
  if (line.starts_with("HTTP/")) {  // a new response (after 100-continue or a redirect): start over
    t->resp->headers.clear();
    auto sp = line.find(' ');
    t->resp->status =
        sp == std::string_view::npos ? 0 : std::strtol(std::string(line.substr(sp + 1, 3)).c_str(), nullptr, 10);
    return len;
  }
  auto colon = line.find(':');
  if (colon != std::string_view::npos)
    t->resp->headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  return len;
}

size_t on_body_impl(Transfer* t, char* data, size_t len) {
  if (t->sink && t->in_2xx()) {
    if (t->expect && t->resp->status != t->expect) {
      t->unexpected = true;
      return 0;
    }
    if (!t->check_response()) return 0;
    Status s = (*t->sink)(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), len));
    if (!s.ok()) {
      t->sink_status = std::move(s);
      return 0;  // aborts the transfer
    }
    t->delivered += len;
    return len;
  }
  if (!t->in_2xx()) {  // an error (or redirect) body: the first bytes are enough for a message
    const uint64_t room = t->max_error_body - std::min<uint64_t>(t->max_error_body, t->resp->body.size());
    t->resp->body.append(data, static_cast<size_t>(std::min<uint64_t>(room, len)));
    if (len > room) {
      t->error_body_cut = true;
      return 0;
    }
    return len;
  }
  if (t->resp->body.size() + len > t->max_body) {
    t->too_large = true;
    return 0;
  }
  t->resp->body.append(data, len);
  return len;
}

// libcurl is C: nothing may be thrown through it (a sink's std::bad_alloc included).
Status out_of_memory(std::string_view where) {
  return Status::OutOfRange(fmt::format("out of memory while receiving {}", where));
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  try {
    return on_header_impl(t, data, size * n);
  } catch (...) {
    t->sink_status = out_of_memory("response headers");
    return 0;
  }
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  try {
    return on_body_impl(t, data, size * n);
  } catch (...) {
    t->sink_status = out_of_memory("a response body");
    return 0;
  }
}

}  // namespace

struct HttpClient::Pool {
  std::mutex mu;
  std::vector<CURL*> free;
  ~Pool() {
    for (CURL* c : free) curl_easy_cleanup(c);
  }
  CURL* acquire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!free.empty()) {
        CURL* c = free.back();
        free.pop_back();
        curl_easy_reset(c);  // keeps live connections and the DNS cache
        return c;
      }
    }
    return curl_easy_init();
  }
  void release(CURL* c) {
    std::lock_guard<std::mutex> lock(mu);
    free.push_back(c);
  }
};

HttpOptions::HttpOptions() {
  auto bad = [&](const char* name, const char* value, const char* what) {
    if (invalid.empty()) invalid = fmt::format("{}='{}' is not {}", name, std::string_view(value).substr(0, 64), what);
  };
  auto seconds = [&](const char* name, double* field, bool zero_ok) {
    const char* v = std::getenv(name);
    if (!v || !*v) return;
    double d = 0;
    if (!parse_seconds(v, &d) || (!zero_ok && d == 0))
      return bad(name, v, zero_ok ? "a number of seconds (0 = none, at most a week)" : "a positive number of seconds");
    *field = d;
  };
  auto count = [&](const char* name, uint64_t min, uint64_t max, auto* field) {
    const char* v = std::getenv(name);
    if (!v || !*v) return;
    uint64_t n = 0;
    if (!parse_count(v, max, &n) || n < min)
      return bad(name, v, fmt::format("a whole number in [{}, {}]", min, max).c_str());
    *field = static_cast<std::remove_reference_t<decltype(*field)>>(n);
  };
  seconds("WEIGHTLIFT_CONNECT_TIMEOUT", &connect_timeout_s, false);
  seconds("WEIGHTLIFT_STALL_TIMEOUT", &stall_timeout_s, false);
  seconds("WEIGHTLIFT_REQUEST_TIMEOUT", &request_timeout_s, true);
  uint64_t retries = static_cast<uint64_t>(retry.max_attempts - 1);
  count("WEIGHTLIFT_RETRIES", 0, 100, &retries);
  retry.max_attempts = static_cast<int>(retries) + 1;
  count("WEIGHTLIFT_MAX_REDIRECTS", 0, 100, &max_redirects);
  count("WEIGHTLIFT_LIST_MAX_PAGES", 1, uint64_t{1} << 40, &max_list_pages);
  count("WEIGHTLIFT_LIST_MAX_ENTRIES", 1, uint64_t{1} << 40, &max_list_entries);
  seconds("WEIGHTLIFT_LIST_TIMEOUT", &list_timeout_s, true);
}

std::chrono::steady_clock::time_point listing_deadline(const HttpOptions& o) {
  if (o.list_timeout_s <= 0) return {};
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.list_timeout_s));
}

Status listing_overdue(const HttpOptions& o, std::chrono::steady_clock::time_point deadline, const std::string& what,
                       uint64_t pages, uint64_t entries) {
  if (deadline == std::chrono::steady_clock::time_point{} || Clock::now() < deadline) return Status();
  return Status::OutOfRange(
      fmt::format("{} did not end within {} (WEIGHTLIFT_LIST_TIMEOUT): {} pages, {} entries so far", what,
                  secs(o.list_timeout_s), pages, entries));
}

ScopedNetworkDeadline::ScopedNetworkDeadline(double seconds, std::string setting) {
  std::lock_guard lk(g_deadline_mu);
  previous_ns_ = g_deadline_ns.load();
  previous_setting_ = g_deadline_setting;
  const auto at =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, seconds)));
  const int64_t ns =
      std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count());
  if (previous_ns_ == 0 || ns < previous_ns_) {
    g_deadline_ns = ns;
    g_deadline_setting = fmt::format("{} {}", setting, secs(seconds));
  }
}

ScopedNetworkDeadline::~ScopedNetworkDeadline() {
  std::lock_guard lk(g_deadline_mu);
  g_deadline_ns = previous_ns_;
  g_deadline_setting = previous_setting_;
}

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)), pool_(std::make_unique<Pool>()) {
  std::call_once(g_curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (options_.retry.max_attempts < 1) options_.retry.max_attempts = 1;
}

HttpClient::~HttpClient() = default;

std::string url_origin(const std::string& url) {
  auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return {};
  std::string scheme = lower(url.substr(0, scheme_end));
  size_t host_start = scheme_end + 3;
  size_t host_end = url.find_first_of("/?#", host_start);
  std::string authority =
      lower(url.substr(host_start, host_end == std::string::npos ? std::string::npos : host_end - host_start));
  auto at = authority.rfind('@');
  if (at != std::string::npos) authority = authority.substr(at + 1);
  size_t colon_from = authority.starts_with('[') ? authority.find(']') : 0;
  bool has_port = colon_from != std::string::npos && authority.find(':', colon_from) != std::string::npos;
  if (!has_port) authority += scheme == "https" ? ":443" : ":80";
  return scheme + "://" + authority;
}

std::string url_quote(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

Status check_secret(std::string_view secret, std::string_view source) {
  if (!has_control_chars(secret)) return Status();
  return Status::InvalidArgument(
      fmt::format("{} holds a line break, another control character or bytes that are not UTF-8: refusing to send "
                  "it (its value is not shown)",
                  source));
}

HubErrorKind classify_hub_error(const HttpResponse& r) {
  if (r.status >= 200 && r.status < 400) return HubErrorKind::kNone;
  std::string code = r.header("x-error-code");
  std::string msg = r.header("x-error-message");
  if (code == "RevisionNotFound") return HubErrorKind::kRevisionNotFound;
  if (code == "EntryNotFound") return HubErrorKind::kEntryNotFound;
  if (code == "GatedRepo") return HubErrorKind::kGated;
  if (msg == "Access to this resource is disabled.") return HubErrorKind::kDisabled;
  if (code == "RepoNotFound" || r.status == 401) return HubErrorKind::kRepoNotFound;
  return HubErrorKind::kOther;
}

Status status_from_response(const HttpResponse& r, const std::string& url) {
  std::string where = redact(url);
  std::string status = "HTTP " + std::to_string(r.status);
  switch (classify_hub_error(r)) {
    case HubErrorKind::kNone: return Status();
    case HubErrorKind::kRevisionNotFound: return Status::NotFound("revision not found (" + status + ") for " + where);
    case HubErrorKind::kEntryNotFound: return Status::NotFound("entry not found (" + status + ") for " + where);
    case HubErrorKind::kGated:
      return Status::PermissionDenied("gated repository: access is restricted, log in or pass a token with access (" +
                                      status + ") for " + where);
    case HubErrorKind::kDisabled: return Status::PermissionDenied("repository disabled (" + status + ") for " + where);
    case HubErrorKind::kRepoNotFound:
      return Status::NotFound("repository not found (" + status +
                              "); check the repository id, or the token for a private or gated repository, for " +
                              where);
    case HubErrorKind::kOther: break;
  }
  if (r.status == 403) return Status::PermissionDenied("forbidden (" + status + ") for " + where);
  if (r.status == 404) return Status::NotFound("not found (" + status + ") for " + where);
  if (retryable_status(r.status)) return Status::Unavailable("server busy or failing (" + status + ") for " + where);
  return Status::InvalidArgument("unexpected " + status + " for " + where);
}

// What one attempt did, for run()'s decisions and messages.
struct HttpClient::Attempt {
  long timeout_ms = 0;     // CURLOPT_TIMEOUT_MS (0: none)
  uint64_t delivered = 0;  // body bytes handed to the sink
  bool transport_error = false;
  bool answered = false;  // a status line arrived
  std::string detail;     // curl's own words for a transport error
};

Result<HttpResponse> HttpClient::perform_once(const HttpRequest& req, const std::string& url, bool send_auth,
                                              const BodySink* sink, Attempt* a) {
  a->transport_error = false;
  a->answered = false;
  a->detail.clear();
  if (!http_scheme(url))  // libcurl refuses it too (CURLOPT_PROTOCOLS_STR); this names it
    return Status::InvalidArgument(
        fmt::format("refusing a {}:// URL: only http and https are allowed ({})", scheme_of(url), redact(url)));
  CURL* c = pool_->acquire();
  if (!c) return Status::Internal("curl_easy_init failed");
  HttpResponse resp;
  resp.url = url;
  Transfer t;
  t.resp = &resp;
  t.sink = sink;
  t.max_body = req.max_body_bytes;
  t.max_error_body = options_.max_error_body_bytes;
  t.max_header = options_.max_header_bytes;
  t.expect = sink ? req.expect_status : 0;
  t.head = req.method == "HEAD";
  t.on_response = sink ? &req.on_response : nullptr;
  curl_slist* hdrs = nullptr;
  for (const auto& [k, v] : req.headers) {
    if (!send_auth && (lower(k) == "authorization" || lower(k) == "x-amz-security-token")) continue;
    hdrs = curl_slist_append(hdrs, (k + ": " + v).c_str());
  }
  char errbuf[CURL_ERROR_SIZE];
  errbuf[0] = '\0';
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  // The policy: http and https only, for this request and any redirect curl would see.
#if LIBCURL_VERSION_NUM >= 0x075500  // 7.85: the string forms
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
  curl_easy_setopt(c, CURLOPT_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS, static_cast<long>(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, static_cast<long>(options_.max_redirects));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
  curl_easy_setopt(c, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::max(1L, static_cast<long>(options_.connect_timeout_s * 1000)));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(std::ceil(options_.stall_timeout_s))));
  if (a->timeout_ms > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, a->timeout_ms);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
  if (req.method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  const std::string& ca_bundle = options_.ca_bundle.empty() ? system_ca_bundle() : options_.ca_bundle;
  if (!ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_bundle.c_str());
  if (req.sigv4 && send_auth) {  // never sign for another host after a redirect
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, req.sigv4->provider.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, req.sigv4->access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, req.sigv4->secret_access_key.c_str());
  }
  CURLcode rc = curl_easy_perform(c);
  // A 2xx response with an empty body still goes past the caller's check.
  if (rc == CURLE_OK && sink && t.in_2xx() && !(t.expect && resp.status != t.expect)) (void)t.check_response();
  char* redirect = nullptr;
  if (resp.status >= 300 && resp.status < 400 && curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &redirect) == CURLE_OK &&
      redirect)
    resp.headers["x-wl-redirect-url"] = redirect;
  a->answered = resp.status != 0;
  std::string detail = errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc));
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, nullptr);
  curl_slist_free_all(hdrs);
  if (rc != CURLE_OK) {
    // A failed handle may hold a broken connection (or a body left unread); do not pool it.
    curl_easy_cleanup(c);
  } else {
    pool_->release(c);
  }
  a->delivered = t.delivered;
  if (!t.sink_status.ok()) return t.sink_status;
  if (t.unexpected) return resp;
  if (t.headers_too_large)
    return Status::OutOfRange(
        fmt::format("response headers larger than {} bytes from {}", options_.max_header_bytes, redact(url)));
  if (t.too_large)
    return Status::OutOfRange("response body larger than " + std::to_string(req.max_body_bytes) + " bytes from " +
                              redact(url));
  if (t.error_body_cut) return resp;  // the first bytes are enough for a message
  if (rc != CURLE_OK) {
    a->transport_error = true;
    a->detail = detail;
    return Status::Unavailable(std::string("connection failed: ") + detail + " (" + redact(url) + ")");
  }
  return resp;
}

Result<HttpResponse> HttpClient::run(const HttpRequest& req, const BodySink* sink, uint64_t* delivered) {
  if (delivered) *delivered = 0;
  if (!options_.invalid.empty()) return Status::InvalidArgument(options_.invalid);
  if (!http_scheme(req.url))
    return Status::InvalidArgument(
        fmt::format("refusing a {}:// URL: only http and https are allowed ({})", scheme_of(req.url), redact(req.url)));
  WL_RETURN_IF_ERROR(check_request_text(req, req.url));
  const std::string origin = url_origin(req.url);
  const auto start = Clock::now();
  // The earliest of: the request's own deadline, request_timeout_s, the process's (--deadline).
  Clock::time_point deadline = req.deadline;  // callers set it for request_timeout_s over resumes
  std::string deadline_setting = options_.request_timeout_s > 0
                                     ? "--request-timeout " + secs(options_.request_timeout_s)
                                     : "the caller's deadline";
  if (options_.request_timeout_s > 0) {
    auto d =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.request_timeout_s));
    if (deadline == Clock::time_point{} || d < deadline) {
      deadline = d;
      deadline_setting = "--request-timeout " + secs(options_.request_timeout_s);
    }
  }
  std::string process_setting;
  if (auto p = process_deadline(&process_setting);
      p != Clock::time_point{} && (deadline == Clock::time_point{} || p < deadline)) {
    deadline = p;
    deadline_setting = process_setting;
  }
  const bool has_deadline = deadline != Clock::time_point{};
  auto remaining_s = [&] { return std::chrono::duration<double>(deadline - Clock::now()).count(); };
  const std::string what = req.method + " " + redact(req.url);
  auto settings = [&] {
    return fmt::format("--connect-timeout {}, --stall-timeout {}, --retries {}", secs(options_.connect_timeout_s),
                       secs(std::max(1.0, std::ceil(options_.stall_timeout_s))), options_.retry.max_attempts - 1);
  };
  auto deadline_passed = [&](int attempts) {
    return Status::Unavailable(fmt::format("{}: the deadline ({}) passed after {} attempt{} in {:.1f} s", what,
                                           deadline_setting, attempts, attempts == 1 ? "" : "s", seconds_since(start)));
  };
  if (auto dead = options_.dead_host_window_s > 0 ? dead_host(origin) : std::nullopt)
    return Status::Unavailable(
        fmt::format("{}: not tried: {} did not answer {:.0f} s ago ({}); it is tried again {:g} s after that", what,
                    origin, seconds_since(dead->since), dead->why, options_.dead_host_window_s));

  std::string url = req.url;
  bool send_auth = true, answered = false;
  int attempt = 0, hops = 0;
  for (;;) {
    Attempt a;
    if (has_deadline) {
      const double left = remaining_s();
      if (left <= 0) return deadline_passed(attempt);
      a.timeout_ms = std::max(1L, static_cast<long>(std::ceil(left * 1000)));
    }
    auto r = perform_once(req, url, send_auth, sink, &a);
    answered |= a.answered;
    if (a.answered) mark_alive(url_origin(url));
    if (delivered) *delivered = a.delivered;
    const bool can_retry = attempt + 1 < options_.retry.max_attempts && a.delivered == 0;
    auto wait_then_retry = [&](double delay) {
      if (has_deadline && delay >= remaining_s()) return false;  // no time left for another try
      sleep_s(delay);
      ++attempt;
      return true;
    };
    if (!r.ok()) {
      if (!a.transport_error) return std::move(r).status();
      if (has_deadline && remaining_s() <= 0.05) return deadline_passed(attempt + 1);
      if (can_retry && wait_then_retry(jittered_backoff(options_.retry, attempt))) continue;
      const int tries = attempt + 1;
      const std::string tried =
          fmt::format("{} attempt{} in {:.1f} s", tries, tries == 1 ? "" : "s", seconds_since(start));
      if (!answered && a.delivered == 0)
        mark_dead(url_origin(url), options_.dead_host_window_s, fmt::format("{}; {}", a.detail, tried));
      return Status::Unavailable(fmt::format("connection failed: {}: {} ({}; {})", what, a.detail, tried, settings()));
    }
    HttpResponse resp = std::move(r).value();
    if (retryable_status(resp.status)) {
      double delay = jittered_backoff(options_.retry, attempt);
      std::string ra = resp.header("retry-after");
      if (!ra.empty() && std::all_of(ra.begin(), ra.end(), ::isdigit) && ra.size() < 8)
        delay = std::min(static_cast<double>(std::stol(ra)), options_.retry.max_delay_s);
      if (can_retry && wait_then_retry(delay)) continue;
      Status s = status_from_response(resp, url);
      return Status::Unavailable(
          fmt::format("{} after {} attempts in {:.1f} s", s.message(), attempt + 1, seconds_since(start)));
    }
    if (resp.status >= 300 && resp.status < 400 && !resp.header("location").empty()) {
      const std::string loc = resp.header("location");
      const bool relative = loc.find("://") == std::string::npos;
      if (req.follow_redirects || (relative && req.follow_relative_redirects)) {
        if (++hops > options_.max_redirects)
          return Status::Unavailable(fmt::format("too many redirects (more than {}, WEIGHTLIFT_MAX_REDIRECTS) from {}",
                                                 options_.max_redirects, redact(req.url)));
        std::string next = resp.header("x-wl-redirect-url");
        if (!relative && !http_scheme(loc)) next = loc;  // curl leaves other schemes out: name it below
        if (next.empty()) return Status::InvalidArgument("unusable redirect Location from " + redact(url));
        if (!http_scheme(next))
          return Status::InvalidArgument(
              fmt::format("refusing to follow a redirect to a {}:// URL from {}: only http and https are allowed",
                          scheme_of(next), redact(url)));
        WL_RETURN_IF_ERROR(check_request_text(req, next));
        if (url_origin(next) != origin) send_auth = false;  // never hand the token to another host
        url = next;
        continue;
      }
    }
    resp.headers.erase("x-wl-redirect-url");
    return resp;
  }
}

// The API boundary: an allocation that fails is an error, never an exception.
Result<HttpResponse> HttpClient::request(const HttpRequest& req) {
  try {
    return run(req, nullptr, nullptr);
  } catch (const std::bad_alloc&) {
    return out_of_memory("an HTTP answer (" + redact(req.url) + ")");
  }
}

Result<HttpResponse> HttpClient::get(const HttpRequest& req, const BodySink& sink, uint64_t* delivered) {
  try {
    return run(req, &sink, delivered);
  } catch (const std::bad_alloc&) {
    return out_of_memory("an HTTP answer (" + redact(req.url) + ")");
  }
}

}  // namespace wl

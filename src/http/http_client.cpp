// libcurl-backed HttpClient (see include/weightlift/http.h).
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "weightlift/http.h"

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

// URLs in messages lose their query (signed CDN URLs carry credentials there).
std::string redact(const std::string& url) { return url.substr(0, url.find('?')); }

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
  Status sink_status;
  bool too_large = false;
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

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {  // a new response (after 100-continue or a redirect): start over
    t->resp->headers.clear();
    auto sp = line.find(' ');
    t->resp->status = sp == std::string_view::npos ? 0 : std::strtol(std::string(line.substr(sp + 1, 3)).c_str(), nullptr, 10);
    return size * n;
  }
  auto colon = line.find(':');
  if (colon != std::string_view::npos) t->resp->headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  return size * n;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
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
  if (t->resp->body.size() + len > t->max_body) {
    t->too_large = true;
    return 0;
  }
  t->resp->body.append(data, len);
  return len;
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
  std::string authority = lower(url.substr(host_start, host_end == std::string::npos ? std::string::npos : host_end - host_start));
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
    case HubErrorKind::kNone:
      return Status::Ok();
    case HubErrorKind::kRevisionNotFound:
      return Status::NotFound("revision not found (" + status + ") for " + where);
    case HubErrorKind::kEntryNotFound:
      return Status::NotFound("entry not found (" + status + ") for " + where);
    case HubErrorKind::kGated:
      return Status::PermissionDenied("gated repository: access is restricted, log in or pass a token with access (" +
                                      status + ") for " + where);
    case HubErrorKind::kDisabled:
      return Status::PermissionDenied("repository disabled (" + status + ") for " + where);
    case HubErrorKind::kRepoNotFound:
      return Status::NotFound("repository not found (" + status +
                              "); check the repository id, or the token for a private or gated repository, for " + where);
    case HubErrorKind::kOther:
      break;
  }
  if (r.status == 403) return Status::PermissionDenied("forbidden (" + status + ") for " + where);
  if (r.status == 404) return Status::NotFound("not found (" + status + ") for " + where);
  if (retryable_status(r.status)) return Status::Unavailable("server busy or failing (" + status + ") for " + where);
  return Status::InvalidArgument("unexpected " + status + " for " + where);
}

Result<HttpResponse> HttpClient::perform_once(const HttpRequest& req, const std::string& url, bool send_auth,
                                              const BodySink* sink, uint64_t* delivered, bool* transport_error) {
  *transport_error = false;
  CURL* c = pool_->acquire();
  if (!c) return Status::Internal("curl_easy_init failed");
  HttpResponse resp;
  resp.url = url;
  Transfer t;
  t.resp = &resp;
  t.sink = sink;
  t.max_body = req.max_body_bytes;
  t.expect = sink ? req.expect_status : 0;
  t.on_response = sink ? &req.on_response : nullptr;
  curl_slist* hdrs = nullptr;
  for (const auto& [k, v] : req.headers) {
    if (!send_auth && (lower(k) == "authorization" || lower(k) == "x-amz-security-token")) continue;
    hdrs = curl_slist_append(hdrs, (k + ": " + v).c_str());
  }
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
  curl_easy_setopt(c, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_s * 1000));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(options_.stall_timeout_s)));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
  if (req.method == "HEAD") curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  if (!options_.ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options_.ca_bundle.c_str());
  if (req.sigv4 && send_auth) {  // never sign for another host after a redirect
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, req.sigv4->provider.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, req.sigv4->access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, req.sigv4->secret_access_key.c_str());
  }
  CURLcode rc = curl_easy_perform(c);
  // A 2xx response with an empty body still goes past the caller's check.
  if (rc == CURLE_OK && sink && t.in_2xx() && !(t.expect && resp.status != t.expect)) (void)t.check_response();
  char* redirect = nullptr;
  if (rc == CURLE_OK && curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &redirect) == CURLE_OK && redirect)
    resp.headers["x-wl-redirect-url"] = redirect;
  curl_slist_free_all(hdrs);
  if (rc != CURLE_OK) {
    // A failed handle may hold a broken connection; do not pool it.
    curl_easy_cleanup(c);
  } else {
    pool_->release(c);
  }
  if (delivered) *delivered = t.delivered;
  if (!t.sink_status.ok()) return t.sink_status;
  if (t.unexpected) return resp;
  if (t.too_large)
    return Status::OutOfRange("response body larger than " + std::to_string(req.max_body_bytes) + " bytes from " + redact(url));
  if (rc != CURLE_OK) {
    *transport_error = true;
    return Status::Unavailable(std::string("connection failed: ") + curl_easy_strerror(rc) + " (" + redact(url) + ")");
  }
  return resp;
}

Result<HttpResponse> HttpClient::run(const HttpRequest& req, const BodySink* sink, uint64_t* delivered) {
  const std::string origin = url_origin(req.url);
  std::string url = req.url;
  bool send_auth = true;
  int attempt = 0, hops = 0;
  if (delivered) *delivered = 0;
  for (;;) {
    uint64_t got = 0;
    bool transport_error = false;
    auto r = perform_once(req, url, send_auth, sink, &got, &transport_error);
    if (delivered) *delivered = got;
    const bool can_retry = attempt + 1 < options_.retry.max_attempts && got == 0;
    if (!r.ok()) {
      if (transport_error && can_retry) {
        sleep_s(jittered_backoff(options_.retry, attempt++));
        continue;
      }
      return std::move(r).status();
    }
    HttpResponse resp = std::move(r).value();
    if (retryable_status(resp.status)) {
      if (!can_retry) {
        Status s = status_from_response(resp, url);
        return Status::Unavailable(s.message() + " after " + std::to_string(attempt + 1) + " attempts");
      }
      double delay = jittered_backoff(options_.retry, attempt++);
      std::string ra = resp.header("retry-after");
      if (!ra.empty() && std::all_of(ra.begin(), ra.end(), ::isdigit) && ra.size() < 8)
        delay = std::min(static_cast<double>(std::stol(ra)), options_.retry.max_delay_s);
      sleep_s(delay);
      continue;
    }
    if (resp.status >= 300 && resp.status < 400 && !resp.header("location").empty()) {
      const std::string loc = resp.header("location");
      const bool relative = loc.find("://") == std::string::npos;
      if (req.follow_redirects || (relative && req.follow_relative_redirects)) {
        if (++hops > options_.max_redirects) return Status::Unavailable("too many redirects from " + redact(req.url));
        std::string next = resp.header("x-wl-redirect-url");
        if (next.empty()) return Status::InvalidArgument("unusable redirect Location from " + redact(url));
        if (url_origin(next) != origin) send_auth = false;  // never hand the token to another host
        url = next;
        continue;
      }
    }
    resp.headers.erase("x-wl-redirect-url");
    return resp;
  }
}

Result<HttpResponse> HttpClient::request(const HttpRequest& req) { return run(req, nullptr, nullptr); }

Result<HttpResponse> HttpClient::get(const HttpRequest& req, const BodySink& sink, uint64_t* delivered) {
  return run(req, &sink, delivered);
}

}  // namespace wl

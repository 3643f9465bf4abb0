// The http:// and https:// source: a URL is one object read with ranged GETs
// (remote_file.h); redirects are followed (credentials never cross hosts).
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "http/remote_file.h"

namespace wl::remote {

namespace {

class HttpTarget final : public ObjectTarget {
 public:
  explicit HttpTarget(std::string url) : url_(std::move(url)), name_(url_.substr(0, url_.find('?'))) {}
  const std::string& name() const override { return name_; }
  Result<HttpRequest> request(const std::string& method) const override {
    HttpRequest r;
    r.method = method;
    r.url = url_;
    return r;
  }
  Status error(const HttpResponse& r) const override {
    const std::string what = fmt::format("HTTP {}", r.status);
    switch (r.status) {
      case 401:
      case 403: return Status::PermissionDenied(fmt::format("access denied ({})", what)).with_file(name_);
      case 404:
      case 410: return Status::NotFound(fmt::format("not found ({})", what)).with_file(name_);
      case 412: return changed_since_planned(name_);
      case 416: return Status::OutOfRange(fmt::format("range not satisfiable ({})", what)).with_file(name_);
      default: break;
    }
    if (r.status == 429 || r.status >= 500)
      return Status::Unavailable(fmt::format("server busy or failing ({})", what)).with_file(name_);
    return Status::InvalidArgument(fmt::format("unexpected {}", what)).with_file(name_);
  }

 private:
  std::string url_, name_;
};

class HttpEnv final : public Env {
 public:
  explicit HttpEnv(std::optional<HttpOptions> o) : fixed_(o.has_value()) {
    if (o) http_ = std::make_shared<HttpClient>(std::move(*o));
  }
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options) override {
    return open_remote(client(), std::make_shared<HttpTarget>(path), options);
  }
  Result<uint64_t> file_size(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(ObjectStat st, stat_object(*client(), HttpTarget(path)));
    return st.size;
  }
  bool exists(const std::string& path) override { return stat_object(*client(), HttpTarget(path)).ok(); }
  bool is_directory(const std::string&) override { return false; }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    return Status::Unimplemented("an http(s) URL cannot be listed; name its files one by one").with_file(path);
  }

 private:
  // The client: fixed, or built from the environment again when a network setting changed.
  std::shared_ptr<HttpClient> client() {
    std::lock_guard lk(mu_);
    if (fixed_) return http_;
    std::string now = network_settings_fingerprint();
    if (!http_ || now != fingerprint_) {
      http_ = std::make_shared<HttpClient>(HttpOptions());
      fingerprint_ = std::move(now);
    }
    return http_;
  }
  const bool fixed_;
  std::mutex mu_;
  std::string fingerprint_;
  std::shared_ptr<HttpClient> http_;
};

}  // namespace

std::unique_ptr<Env> new_http_env(std::optional<HttpOptions> options) {
  return std::make_unique<HttpEnv>(std::move(options));
}

const std::vector<std::string>& network_setting_variables() {
  static const std::vector<std::string> v = {"WEIGHTLIFT_CONNECT_TIMEOUT",  "WEIGHTLIFT_STALL_TIMEOUT",
                                             "WEIGHTLIFT_REQUEST_TIMEOUT",  "WEIGHTLIFT_RETRIES",
                                             "WEIGHTLIFT_MAX_REDIRECTS",    "WEIGHTLIFT_LIST_MAX_PAGES",
                                             "WEIGHTLIFT_LIST_MAX_ENTRIES", "WEIGHTLIFT_LIST_TIMEOUT"};
  return v;
}

std::string network_settings_fingerprint() {
  std::string out;
  for (const auto& name : network_setting_variables()) {
    const char* v = std::getenv(name.c_str());
    out += v ? "=" + std::string(v) : std::string("-");
    out += '\n';
  }
  return out;
}

}  // namespace wl::remote

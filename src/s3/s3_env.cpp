// The s3:// and gs:// source: objects read through remote::RemoteFile,
// listings through ListObjectsV2 (see weightlift/s3.h).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "http/remote_file.h"
#include "s3/s3_names.h"
#include "s3/s3_xml.h"
#include "util/digest.h"
#include "weightlift/s3.h"

namespace wl {

namespace {

// SHA-256 of the empty payload: every request here is a GET or HEAD without a body.
constexpr const char* kEmptyPayloadSha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Empty pages in a row that still claim more (IsTruncated): a broken or hostile server.
constexpr int kMaxEmptyPages = 3;

// A key's name below the listed prefix must be a plain relative path: what a
// folder on disk could hold under the same name. One trailing '/' (a folder
// marker object) is allowed.
Status check_listed_name(std::string_view rel, const std::string& key, const std::string& path) {
  std::string_view r = rel;
  if (r.ends_with('/')) r.remove_suffix(1);
  const std::string why = s3names::relative_path_problem(r);
  if (why.empty()) return Status();
  return Status::Corrupt(fmt::format("refusing listed key '{}': {} (not a plain relative path below the prefix)",
                                     s3names::printable_name(key), why))
      .with_file(path);
}

// A Status for a non-2xx S3 answer: the HTTP status, S3's error code and
// message from the XML body, and what to check.
Status s3_status(const HttpResponse& r, const std::string& name, const S3Config& c) {
  auto body = s3::parse_error_body(r.body);
  const std::string code = body ? body->code : std::string();
  std::string detail = fmt::format("HTTP {}", r.status);
  if (!code.empty()) detail += " " + code;
  if (body && !body->message.empty()) detail += ": " + body->message;
  std::string region = r.header("x-amz-bucket-region");
  if (region.empty() && body) region = body->region;
  if (!region.empty() && region != c.region &&
      (r.status == 301 || r.status == 307 || code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed"))
    return Status::InvalidArgument(fmt::format("the bucket is in region {}, not {} ({}); set AWS_REGION={}", region,
                                               c.region, detail, region))
        .with_file(name);
  switch (r.status) {
    case 401:
    case 403: {
      std::string how = c.anonymous               ? "an unsigned (anonymous) request"
                        : !c.bearer_token.empty() ? "a request with " + c.credentials_source
                                                  : "a request signed with keys from " + c.credentials_source;
      return Status::PermissionDenied(fmt::format("access denied ({}); {} to {}", detail, how, c.endpoint))
          .with_file(name);
    }
    case 404:
      if (code == "NoSuchBucket") return Status::NotFound(fmt::format("no such bucket ({})", detail)).with_file(name);
      if (code == "NoSuchKey") return Status::NotFound(fmt::format("no such key ({})", detail)).with_file(name);
      return Status::NotFound(fmt::format("not found ({})", detail)).with_file(name);
    case 412: return remote::changed_since_planned(name);
    case 416: return Status::OutOfRange(fmt::format("range not satisfiable ({})", detail)).with_file(name);
    default: break;
  }
  if (r.status == 429 || r.status >= 500)
    return Status::Unavailable(fmt::format("server busy or failing ({})", detail)).with_file(name);
  return Status::InvalidArgument(fmt::format("unexpected answer ({}) from {}", detail, c.endpoint)).with_file(name);
}

// The whole object's hash a HEAD vouches for, the fastest to check first: GCS's x-goog-hash (crc32c,
// else md5), S3's full-object x-amz-checksum-* (a composite "<b64>-N" of a multipart upload covers parts
// only: not used), else a single-part upload's MD5 ETag (32 hex; not under SSE-KMS or SSE-C, whose
// ETags are no MD5).
std::optional<VouchedHash> object_hash(const HttpResponse& head) {
  const std::string goog = head.header("x-goog-hash");  // "crc32c=<b64>,md5=<b64>" (last header line kept)
  for (const char* alg : {"crc32c", "md5"}) {
    const auto at = goog.find(std::string(alg) + "=");
    if (at == std::string::npos || (at > 0 && goog[at - 1] != ',' && goog[at - 1] != ' ')) continue;
    const auto begin = at + std::strlen(alg) + 1;
    const std::string hex = base64_to_hex(goog.substr(begin, goog.find(',', begin) - begin));
    if (!hex.empty()) return VouchedHash{alg, hex, "x-goog-hash"};
  }
  const bool composite = head.header("x-amz-checksum-type") == "COMPOSITE";
  for (const char* alg : {"crc32c", "crc32", "sha256", "sha1"}) {
    const std::string v = head.header(std::string("x-amz-checksum-") + alg);
    if (v.empty() || composite || v.find('-') != std::string::npos) continue;
    const std::string hex = base64_to_hex(v);
    if (!hex.empty()) return VouchedHash{alg, hex, std::string("x-amz-checksum-") + alg};
  }
  std::string etag = head.header("etag");
  if (etag.size() == 34 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, 32);
  for (auto& ch : etag) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string sse = head.header("x-amz-server-side-encryption");
  if (etag.size() == 32 && etag.find_first_not_of("0123456789abcdef") == std::string::npos && sse != "aws:kms" &&
      sse != "aws:kms:dsse" && head.header("x-amz-server-side-encryption-customer-algorithm").empty())
    return VouchedHash{"md5", etag, "ETag"};
  return std::nullopt;
}

// A configuration and the client that goes with it (its CA bundle).
struct Resolved {
  std::shared_ptr<const S3Config> config;
  std::shared_ptr<HttpClient> http;
};

class S3Target final : public remote::ObjectTarget {
 public:
  S3Target(std::shared_ptr<const S3Config> c, S3Url u, std::vector<std::pair<std::string, std::string>> query = {})
      : c_(std::move(c)), u_(std::move(u)), query_(std::move(query)),
        name_(u_.scheme + "://" + u_.bucket + (u_.key.empty() ? "" : "/" + u_.key)) {}
  const std::string& name() const override { return name_; }
  Result<HttpRequest> request(const std::string& method) const override {
    HttpRequest r;
    r.method = method;
    r.url = s3_request_url(*c_, u_.bucket, u_.key, query_);
    r.follow_redirects = false;  // a redirect means another region: reported, not followed
    r.follow_relative_redirects = false;
    if (method == "HEAD") r.headers.emplace_back("x-amz-checksum-mode", "ENABLED");  // S3's checksums in the answer
    if (!c_->bearer_token.empty()) {
      r.headers.emplace_back("Authorization", "Bearer " + c_->bearer_token);
    } else if (!c_->anonymous && c_->credentials) {
      r.headers.emplace_back("x-amz-content-sha256", kEmptyPayloadSha256);
      if (!c_->credentials->session_token.empty())
        r.headers.emplace_back("x-amz-security-token", c_->credentials->session_token);
      r.sigv4 = AwsSigV4{fmt::format("aws:amz:{}:s3", c_->region), c_->credentials->access_key_id,
                         c_->credentials->secret_access_key};
    }
    return r;
  }
  Status error(const HttpResponse& r) const override { return s3_status(r, name_, *c_); }
  std::optional<VouchedHash> vouched_hash(const HttpResponse& head) const override { return object_hash(head); }

 private:
  std::shared_ptr<const S3Config> c_;
  S3Url u_;
  std::vector<std::pair<std::string, std::string>> query_;
  std::string name_;
};

class S3Env final : public Env {
 public:
  S3Env(std::string scheme, std::optional<S3Config> fixed, std::optional<HttpOptions> http)
      : scheme_(std::move(scheme)), http_options_(std::move(http)) {
    if (fixed) {
      fixed->scheme = scheme_;
      current_ = make(std::move(*fixed));
    }
  }

  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& options) override {
    WL_ASSIGN_OR_RETURN(S3Url u, url_of(path));
    if (u.key.empty() || u.key.back() == '/')
      return Status::InvalidArgument("names a bucket or a prefix, not an object").with_file(path);
    WL_ASSIGN_OR_RETURN(Resolved r, resolved());
    return remote::open_remote(r.http, std::make_shared<S3Target>(r.config, std::move(u)), options);
  }

  Result<uint64_t> file_size(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(S3Url u, url_of(path));
    WL_ASSIGN_OR_RETURN(Resolved r, resolved());
    if (u.key.empty() || u.key.back() == '/')
      return Status::InvalidArgument("names a bucket or a prefix, not an object").with_file(path);
    WL_ASSIGN_OR_RETURN(remote::ObjectStat st, remote::stat_object(*r.http, S3Target(r.config, std::move(u))));
    return st.size;
  }

  bool exists(const std::string& path) override {
    auto u = url_of(path);
    if (!u.ok()) return false;
    if (!u->key.empty() && u->key.back() != '/') {
      auto r = resolved();
      if (!r.ok()) return false;
      if (remote::stat_object(*r->http, S3Target(r->config, *u)).ok()) return true;
    }
    return is_directory(path);
  }

  bool is_directory(const std::string& path) override {
    auto page = list_page(path, "", /*max_keys=*/1);
    if (!page.ok()) return false;
    auto u = url_of(path);
    return u->key.empty() || !page->objects.empty() || !page->prefixes.empty();
  }

  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    WL_ASSIGN_OR_RETURN(S3Url u, url_of(path));
    WL_ASSIGN_OR_RETURN(Resolved res, resolved());
    const HttpOptions& lim = res.http->options();
    const std::string prefix = prefix_of(u);
    std::vector<DirEntry> out;
    std::set<std::string> dirs, tokens;
    std::string token;
    uint64_t seen = 0;  // entries of every page, before folding names into folders
    int empty = 0;      // empty truncated pages in a row
    const auto deadline = listing_deadline(lim);
    for (uint64_t pages = 0;; ++pages) {
      if (pages >= lim.max_list_pages)
        return Status::OutOfRange(
                   fmt::format("listing did not end after {} pages (WEIGHTLIFT_LIST_MAX_PAGES)", lim.max_list_pages))
            .with_file(path);
      if (Status late = listing_overdue(lim, deadline, "the listing", pages, seen); !late.ok())
        return std::move(late).with_file(path);
      WL_ASSIGN_OR_RETURN(s3::ListPage page, list_page(path, token, 0));
      seen += page.objects.size() + page.prefixes.size();
      if (seen > lim.max_list_entries)
        return Status::OutOfRange(fmt::format("listing holds more than {} entries (WEIGHTLIFT_LIST_MAX_ENTRIES)",
                                              lim.max_list_entries))
            .with_file(path);
      for (const auto& o : page.objects) {
        if (!std::string_view(o.key).starts_with(prefix))
          return Status::Corrupt(fmt::format("listing returned key '{}' outside prefix '{}'", o.key, prefix))
              .with_file(path);
        std::string name = o.key.substr(prefix.size());
        if (name.empty()) continue;  // the "folder" marker object itself
        WL_RETURN_IF_ERROR(check_listed_name(name, o.key, path));
        auto slash = name.find('/');
        if (slash != std::string::npos) {  // a server that ignored the delimiter, or a folder marker
          dirs.insert(name.substr(0, slash));
          continue;
        }
        out.push_back(DirEntry{name, false, false, o.size});
      }
      for (const auto& p : page.prefixes) {
        if (!std::string_view(p).starts_with(prefix) || p.back() != '/')
          return Status::Corrupt(fmt::format("listing returned common prefix '{}' outside prefix '{}'", p, prefix))
              .with_file(path);
        WL_RETURN_IF_ERROR(check_listed_name(p.substr(prefix.size()), p, path));  // "m//", "m/../": named
        std::string name = p.substr(prefix.size(), p.size() - prefix.size() - 1);
        if (name.find('/') != std::string::npos) name = name.substr(0, name.find('/'));
        dirs.insert(name);
      }
      if (!page.truncated) break;
      empty = page.objects.empty() && page.prefixes.empty() ? empty + 1 : 0;
      if (empty >= kMaxEmptyPages)
        return Status::Corrupt(
                   fmt::format("listing sent {} empty pages in a row, each claiming more (IsTruncated)", empty))
            .with_file(path);
      if (!tokens.insert(page.next_token).second)
        return Status::Corrupt(fmt::format("listing repeats a continuation token after {} pages", pages + 1))
            .with_file(path);
      token = page.next_token;
    }
    for (const auto& d : dirs) out.push_back(DirEntry{d, true, false, 0});
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) {
      return a.name != b.name ? a.name < b.name : a.is_dir < b.is_dir;
    });
    return out;
  }

 private:
  Result<S3Url> url_of(const std::string& path) const {
    WL_ASSIGN_OR_RETURN(S3Url u, parse_s3_url(path));
    if (u.scheme != scheme_)
      return Status::InvalidArgument(fmt::format("a {}:// URL sent to the {}:// source", u.scheme, scheme_))
          .with_file(path);
    return u;
  }

  static std::string prefix_of(const S3Url& u) { return u.key.empty() || u.key.back() == '/' ? u.key : u.key + "/"; }

  Result<s3::ListPage> list_page(const std::string& path, const std::string& token, int max_keys) {
    WL_ASSIGN_OR_RETURN(S3Url u, url_of(path));
    WL_ASSIGN_OR_RETURN(Resolved r, resolved());
    std::vector<std::pair<std::string, std::string>> q = {
        {"list-type", "2"}, {"delimiter", "/"}, {"prefix", prefix_of(u)}};
    if (!token.empty()) q.emplace_back("continuation-token", token);
    if (max_keys > 0) q.emplace_back("max-keys", std::to_string(max_keys));
    S3Url bucket{u.scheme, u.bucket, ""};
    S3Target target(r.config, bucket, std::move(q));
    WL_ASSIGN_OR_RETURN(HttpRequest req, target.request("GET"));
    req.max_body_bytes = s3::kMaxXmlBytes;
    auto resp = r.http->request(req);
    if (!resp.ok()) return std::move(resp).status().with_file(path);
    if (resp->status < 200 || resp->status >= 300) return s3_status(*resp, path, *r.config);
    return s3::parse_list_objects_v2(resp->body, path);
  }

  Resolved make(S3Config c) const {
    HttpOptions h = http_options_ ? *http_options_ : HttpOptions();
    if (h.ca_bundle.empty()) h.ca_bundle = c.ca_bundle;
    return Resolved{std::make_shared<const S3Config>(std::move(c)), std::make_shared<HttpClient>(std::move(h))};
  }

  // The configuration: fixed, or resolved from the environment again
  // whenever a variable that resolution read has changed.
  Result<Resolved> resolved() {
    std::lock_guard lk(mu_);
    if (current_.config && read_vars_.empty()) return current_;  // fixed at construction (settings included)
    const EnvLookup env = process_environment();
    if (current_.config) {
      bool same = true;
      for (const auto& [name, value] : read_vars_) same = same && env(name) == value;
      if (same) return current_;
    }
    std::vector<std::pair<std::string, std::optional<std::string>>> seen;
    auto recording = [&](const std::string& name) {
      auto v = env(name);
      seen.emplace_back(name, v);
      return v;
    };
    WL_ASSIGN_OR_RETURN(S3Config c, resolve_s3_config(scheme_, recording));
    if (!http_options_)  // the client follows the network settings too
      for (const auto& name : remote::network_setting_variables()) (void)recording(name);
    current_ = make(std::move(c));
    read_vars_ = std::move(seen);
    if (read_vars_.empty()) read_vars_.emplace_back("HOME", env("HOME"));
    return current_;
  }

  const std::string scheme_;
  const std::optional<HttpOptions> http_options_;
  std::mutex mu_;
  Resolved current_;
  std::vector<std::pair<std::string, std::optional<std::string>>> read_vars_;
};

}  // namespace

std::unique_ptr<Env> new_s3_env(std::string scheme, std::optional<S3Config> config, std::optional<HttpOptions> http) {
  return std::make_unique<S3Env>(std::move(scheme), std::move(config), std::move(http));
}

}  // namespace wl

// S3 URLs, configuration from the environment and the AWS shared files, and
// request URLs (see weightlift/s3.h).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "weightlift/s3.h"
#include "weightlift/text.h"

namespace wl {

namespace {

constexpr uint64_t kMaxConfigFileBytes = uint64_t{1} << 20;

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool truthy(std::string_view v) {
  std::string l = lower(trim(v));
  return l == "1" || l == "true" || l == "yes" || l == "on";
}

// An INI file as the AWS CLI writes it: "[section]" then "key = value";
// '#' and ';' start comments; indented lines (nested "s3 =" settings) are
// skipped. Section -> key -> value.
using Ini = std::map<std::string, std::map<std::string, std::string>>;
Ini parse_ini(std::string_view text) {
  Ini ini;
  std::string section;
  bool have_section = false;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const bool indented = !line.empty() && (line.front() == ' ' || line.front() == '\t');
    line = trim(line);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      auto close = line.find(']');
      if (close == std::string_view::npos) {
        have_section = false;
        continue;
      }
      section = std::string(trim(line.substr(1, close - 1)));
      have_section = true;
      continue;
    }
    if (!have_section || indented) continue;
    auto eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    std::string key = lower(trim(line.substr(0, eq)));
    std::string_view value = trim(line.substr(eq + 1));
    if (!key.empty() && !value.empty()) ini[section][key] = std::string(value);
  }
  return ini;
}

// The file as INI; a missing or unreadable file is empty (the AWS CLI's way).
Ini read_ini(Env* fs, const std::string& path) {
  if (path.empty() || !fs->exists(path)) return {};
  auto text = read_file_to_string(path, kMaxConfigFileBytes, fs);
  if (!text.ok()) return {};
  return parse_ini(*text);
}

std::string get(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  return v ? std::string(trim(*v)) : std::string();
}

// "https://host:port/base/" -> "https://host:port/base"; "host:port" gets https://.
Result<std::string> normalize_endpoint(std::string e, const std::string& from) {
  if (e.find("://") == std::string::npos) e = "https://" + e;
  while (e.size() > 1 && e.back() == '/') e.pop_back();
  std::string scheme = lower(e.substr(0, e.find("://")));
  std::string rest = e.substr(e.find("://") + 3);
  if ((scheme != "http" && scheme != "https") || rest.empty() || rest.front() == '/' ||
      rest.find_first_of("?# ") != std::string::npos)
    return Status::InvalidArgument(fmt::format("endpoint '{}' (from {}) is not an http(s) URL", e, from));
  return scheme + "://" + rest;
}

// A key pair from two variables (and a session token from a third, if named):
// nullopt when neither is set; only one of them is kInvalidArgument.
Result<std::optional<S3Credentials>> key_pair(const EnvLookup& env, const std::string& id_var,
                                              const std::string& secret_var, const std::string& token_var) {
  std::string id = get(env, id_var), secret = get(env, secret_var);
  if (id.empty() != secret.empty())
    return Status::InvalidArgument(id.empty() ? secret_var + " is set but " + id_var + " is not"
                                              : id_var + " is set but " + secret_var + " is not");
  if (id.empty()) return std::optional<S3Credentials>();
  const std::string token = token_var.empty() ? "" : get(env, token_var);
  WL_RETURN_IF_ERROR(check_secret(id, id_var));
  WL_RETURN_IF_ERROR(check_secret(secret, secret_var));
  if (!token.empty()) WL_RETURN_IF_ERROR(check_secret(token, token_var));
  return std::optional<S3Credentials>(S3Credentials{id, secret, token});
}

bool dns_compatible(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-'))
      return false;  // dots would break the TLS wildcard certificate
  return bucket.front() != '-' && bucket.back() != '-';
}

}  // namespace

const std::vector<std::string>& object_storage_schemes() {
  static const std::vector<std::string> schemes = {"s3", "gs"};
  return schemes;
}

namespace {

bool object_storage_scheme(const std::string& scheme) {
  const auto& all = object_storage_schemes();
  return std::find(all.begin(), all.end(), scheme) != all.end();
}

}  // namespace

Result<S3Url> parse_s3_url(std::string_view url) {
  S3Url u;
  auto sep = url.find("://");
  if (sep == std::string_view::npos) return Status::InvalidArgument("not an s3:// or gs:// URL").with_file(url);
  u.scheme = lower(url.substr(0, sep));
  if (!object_storage_scheme(u.scheme))
    return Status::InvalidArgument(fmt::format("scheme '{}' is not s3 or gs", u.scheme)).with_file(url);
  std::string_view rest = url.substr(sep + 3);
  auto slash = rest.find('/');
  std::string_view bucket = rest.substr(0, slash);
  std::string_view key = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  if (bucket.empty()) return Status::InvalidArgument("the URL names no bucket").with_file(url);
  if (bucket.size() > 222)
    return Status::InvalidArgument(fmt::format("bucket name of {} characters is too long", bucket.size()))
        .with_file(url);
  for (char c : bucket) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' ||
          c == '.' || c == '_'))
      return Status::InvalidArgument(fmt::format("bucket name '{}' may only hold a-z, 0-9, '.', '-' and '_'", bucket))
          .with_file(url);
  }
  if (key.size() > 1024)
    return Status::InvalidArgument(fmt::format("key of {} bytes is longer than 1024", key.size())).with_file(url);
  if (has_control_chars(key)) return Status::InvalidArgument("the key holds control characters").with_file(url);
  u.bucket = std::string(bucket);
  u.key = std::string(key);
  return u;
}

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<S3Config> resolve_s3_config(std::string_view scheme, const EnvLookup& env, Env* fs) {
  S3Config c;
  c.scheme = lower(scheme);
  if (!object_storage_scheme(c.scheme))
    return Status::InvalidArgument(fmt::format("no S3 configuration for scheme '{}'", scheme));
  c.ca_bundle = get(env, "AWS_CA_BUNDLE");
  c.anonymous = truthy(get(env, "AWS_NO_SIGN_REQUEST"));
  const std::string virt = get(env, "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING");
  if (!virt.empty()) c.addressing = truthy(virt) ? S3Addressing::kVirtual : S3Addressing::kPath;

  if (c.scheme == "gs") {
    c.region = "auto";
    std::string ep = get(env, "WEIGHTLIFT_GS_ENDPOINT_URL");
    WL_ASSIGN_OR_RETURN(c.endpoint, normalize_endpoint(ep.empty() ? "https://storage.googleapis.com" : ep,
                                                       ep.empty() ? "the default" : "WEIGHTLIFT_GS_ENDPOINT_URL"));
    if (c.addressing == S3Addressing::kAuto) c.addressing = S3Addressing::kPath;
    if (c.anonymous) return c;
    WL_ASSIGN_OR_RETURN(c.credentials, key_pair(env, "GS_ACCESS_KEY_ID", "GS_SECRET_ACCESS_KEY", ""));
    if (c.credentials) {
      c.credentials_source = "HMAC keys from the environment (GS_ACCESS_KEY_ID)";
      return c;
    }
    for (const char* var : {"GOOGLE_OAUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_ACCESS_TOKEN"}) {
      std::string tok = get(env, var);
      if (tok.empty()) continue;
      WL_RETURN_IF_ERROR(check_secret(tok, var));
      c.bearer_token = tok;
      c.credentials_source = fmt::format("OAuth token from the environment ({})", var);
      return c;
    }
    return Status::PermissionDenied(
        "no credentials for gs://: set GS_ACCESS_KEY_ID and GS_SECRET_ACCESS_KEY (HMAC keys), or "
        "GOOGLE_OAUTH_ACCESS_TOKEN, or AWS_NO_SIGN_REQUEST=1 for a public bucket");
  }

  // s3: the shared files of the profile.
  std::string profile = get(env, "AWS_PROFILE");
  if (profile.empty()) profile = get(env, "AWS_DEFAULT_PROFILE");
  const bool profile_named = !profile.empty();
  if (!profile_named) profile = "default";
  const std::string home = get(env, "HOME");
  std::string cred_path = get(env, "AWS_SHARED_CREDENTIALS_FILE");
  if (cred_path.empty() && !home.empty()) cred_path = home + "/.aws/credentials";
  std::string conf_path = get(env, "AWS_CONFIG_FILE");
  if (conf_path.empty() && !home.empty()) conf_path = home + "/.aws/config";
  const Ini creds = read_ini(fs, cred_path), conf = read_ini(fs, conf_path);
  const std::map<std::string, std::string>* cred_sec = nullptr;
  const std::map<std::string, std::string>* conf_sec = nullptr;
  if (auto it = creds.find(profile); it != creds.end()) cred_sec = &it->second;
  if (auto it = conf.find(profile == "default" ? "default" : "profile " + profile); it != conf.end())
    conf_sec = &it->second;
  else if (auto it2 = conf.find(profile); it2 != conf.end() && profile != "default")
    conf_sec = &it2->second;  // some tools write [NAME] in the config file too
  if (profile_named && cred_sec == nullptr && conf_sec == nullptr)
    return Status::NotFound(fmt::format("AWS profile '{}' is in neither {} nor {}", profile,
                                        cred_path.empty() ? "~/.aws/credentials" : cred_path,
                                        conf_path.empty() ? "~/.aws/config" : conf_path));
  auto from = [](const std::map<std::string, std::string>* sec, const char* key) -> std::string {
    if (sec == nullptr) return {};
    auto it = sec->find(key);
    return it == sec->end() ? std::string() : it->second;
  };

  c.region = get(env, "AWS_REGION");
  if (c.region.empty()) c.region = get(env, "AWS_DEFAULT_REGION");
  if (c.region.empty()) c.region = from(conf_sec, "region");
  if (c.region.empty()) c.region = "us-east-1";
  for (char ch : c.region)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-'))
      return Status::InvalidArgument(fmt::format("region '{}' is not a region name", c.region));

  std::string ep, ep_from;
  for (const char* var : {"RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    ep = get(env, var);
    if (!ep.empty()) {
      ep_from = var;
      break;
    }
  }
  if (ep.empty() && !(ep = from(conf_sec, "endpoint_url")).empty()) ep_from = "endpoint_url of profile " + profile;
  if (ep.empty()) {
    ep = fmt::format("https://s3.{}.amazonaws.com", c.region);
    ep_from = "the default";
    if (c.addressing == S3Addressing::kAuto) c.addressing = S3Addressing::kVirtual;
  }
  if (c.addressing == S3Addressing::kAuto) c.addressing = S3Addressing::kPath;
  WL_ASSIGN_OR_RETURN(c.endpoint, normalize_endpoint(ep, ep_from));
  if (c.anonymous) return c;

  WL_ASSIGN_OR_RETURN(c.credentials, key_pair(env, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"));
  if (c.credentials) {
    c.credentials_source = "the environment (AWS_ACCESS_KEY_ID)";
  } else {
    for (auto [sec, path] : {std::pair{cred_sec, cred_path}, std::pair{conf_sec, conf_path}}) {
      std::string fid = from(sec, "aws_access_key_id"), fsecret = from(sec, "aws_secret_access_key");
      if (fid.empty() && fsecret.empty()) continue;
      if (fid.empty() || fsecret.empty())
        return Status::InvalidArgument(fmt::format(
            "profile '{}' in {} has only one of aws_access_key_id and aws_secret_access_key", profile, path));
      c.credentials = S3Credentials{fid, fsecret, from(sec, "aws_session_token")};
      c.credentials_source = fmt::format("profile '{}' in {}", profile, path);
      break;
    }
  }
  if (!c.credentials)
    return Status::PermissionDenied(
        "no credentials for s3://: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with "
        "~/.aws/credentials, or AWS_NO_SIGN_REQUEST=1 for a public bucket");
  for (const std::string* v :
       {&c.credentials->access_key_id, &c.credentials->secret_access_key, &c.credentials->session_token})
    WL_RETURN_IF_ERROR(check_secret(*v, "the credentials (from " + c.credentials_source + ")"));
  return c;
}

std::string s3_request_url(const S3Config& config, std::string_view bucket, std::string_view key,
                           std::vector<std::pair<std::string, std::string>> query) {
  const std::string& ep = config.endpoint;
  const size_t host_at = ep.find("://") + 3;
  const size_t path_at = ep.find('/', host_at);
  const std::string origin = ep.substr(0, path_at);
  const std::string base = path_at == std::string::npos ? std::string() : ep.substr(path_at);
  std::string url;
  if (config.addressing == S3Addressing::kVirtual && dns_compatible(bucket)) {
    url = origin.substr(0, host_at) + std::string(bucket) + "." + origin.substr(host_at) + base + "/";
  } else {
    url = origin + base + "/" + url_quote(std::string(bucket), false) + (key.empty() ? "" : "/");
  }
  url += url_quote(std::string(key), true);
  std::sort(query.begin(), query.end());
  for (size_t i = 0; i < query.size(); ++i)
    url += (i == 0 ? "?" : "&") + url_quote(query[i].first, false) + "=" + url_quote(query[i].second, false);
  return url;
}

}  // namespace wl

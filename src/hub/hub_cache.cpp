// Hub settings, names, patterns, the per-model lock.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <fmt/format.h>

#include "hub/hub_internal.h"
#include "weightlift/glob.h"
#include "weightlift/hash.h"
#include "weightlift/io.h"
#include "weightlift/lock.h"
#include "weightlift/text.h"

namespace wl {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

bool truthy(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return false;
  std::string s(v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s == "1" || s == "on" || s == "yes" || s == "true";
}

std::string home() { return env_or("HOME", "/root"); }

std::string hf_home() {
  std::string xdg = env_or("XDG_CACHE_HOME", home() + "/.cache");
  return env_or("HF_HOME", xdg + "/huggingface");
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t a = 0;
  while (a < s.size() && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  return s.substr(a);
}

}  // namespace

std::string hub_endpoint(const HubOptions& o) {
  std::string e = o.endpoint.empty() ? env_or("HF_ENDPOINT", "https://huggingface.co") : o.endpoint;
  while (!e.empty() && e.back() == '/') e.pop_back();
  return e;
}

std::string hub_cache_dir(const HubOptions& o) {
  if (!o.cache_dir.empty()) return o.cache_dir;
  return env_or("HF_HUB_CACHE", env_or("HUGGINGFACE_HUB_CACHE", hf_home() + "/hub"));
}

Result<std::optional<std::string>> hub_token(const HubOptions& o) {
  if (o.token) {
    if (o.token->empty()) return std::optional<std::string>();
    WL_RETURN_IF_ERROR(check_secret(*o.token, "the token given (--token, HubOptions::token)"));
    return o.token;
  }
  std::string source = "HF_TOKEN";
  std::string t = env_or("HF_TOKEN", "");
  if (t.empty()) t = env_or("HUGGING_FACE_HUB_TOKEN", ""), source = "HUGGING_FACE_HUB_TOKEN";
  if (t.empty()) {
    const char* from_var = std::getenv("HF_TOKEN_PATH");
    const std::string path = from_var && *from_var ? from_var : hf_home() + "/token";
    auto f = read_file_to_string(path, 1 << 16);
    if (f.ok()) t = *f;
    source = fmt::format("the token file {}{}", path, from_var && *from_var ? " (HF_TOKEN_PATH)" : "");
  }
  t = trim(t);  // as huggingface_hub does: a trailing newline is not part of the token
  if (t.empty()) return std::optional<std::string>();
  WL_RETURN_IF_ERROR(check_secret(t, source));
  return std::optional<std::string>(std::move(t));
}

bool hub_offline(const HubOptions& o) {
  if (o.offline) return *o.offline;
  return truthy("HF_HUB_OFFLINE") || truthy("TRANSFORMERS_OFFLINE");
}

bool use_modelscope() { return truthy("VLLM_USE_MODELSCOPE"); }

std::string repo_folder_name(const std::string& repo_id, const std::string& repo_type) {
  std::string out = repo_type + "s";
  size_t start = 0;
  for (;;) {
    size_t slash = repo_id.find('/', start);
    out += "--" + repo_id.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return out;
}

std::vector<std::string> filter_repo_files(const std::vector<std::string>& files, const std::vector<std::string>& allow,
                                           const std::vector<std::string>& ignore) {
  auto widen = [](std::vector<std::string> ps) {
    for (auto& p : ps)
      if (!p.empty() && p.back() == '/') p += "*";
    return ps;
  };
  auto a = widen(allow), ig = widen(ignore);
  std::vector<std::string> out;
  for (const auto& f : files) {
    bool ok = a.empty();
    for (const auto& p : a) ok = ok || glob_match(p, f);
    for (const auto& p : ig) ok = ok && !glob_match(p, f);
    if (ok) out.push_back(f);
  }
  return out;
}

Status check_repo_path(const std::string& name) {
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("refusing repository file name '" + name + "': " + why);
  };
  if (name.empty()) return bad("empty");
  if (name.front() == '/') return bad("absolute path");
  if (name.find('\\') != std::string::npos) return bad("backslash");
  if (has_control_chars(name))
    return bad("it holds a control character (a line break, a tab, an escape...) or bytes that are not UTF-8");
  size_t start = 0;
  for (;;) {
    size_t slash = name.find('/', start);
    std::string part = name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return bad("'.', '..' or empty path component (path traversal)");
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return Status();
}

Status check_repo_id(const std::string& repo_id) {
  auto bad = [&](const char* why) {
    return Status::InvalidArgument("invalid repository id '" + repo_id + "': " + why);
  };
  if (repo_id.empty() || repo_id.size() > 96) return bad("empty or longer than 96 characters");
  int slashes = 0;
  for (char c : repo_id) {
    if (c == '/') {
      ++slashes;
      continue;
    }
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return bad("only letters, digits, '-', '_', '.' and one '/' are allowed");
  }
  if (slashes > 1) return bad("more than one '/'");
  if (repo_id.find("--") != std::string::npos || repo_id.find("..") != std::string::npos)
    return bad("'--' and '..' are forbidden");
  if (repo_id.front() == '/' || repo_id.back() == '/' || repo_id.front() == '.' || repo_id.front() == '-')
    return bad("must not start or end with '/', or start with '.' or '-'");
  return Status();
}

Status check_revision(const std::string& rev) {
  if (rev.empty()) return Status::InvalidArgument("empty revision");
  Status s = check_repo_path(rev);
  if (!s.ok()) return Status::InvalidArgument("invalid revision '" + rev + "': would escape refs/");
  return Status();
}

bool is_commit_hash(const std::string& s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  return true;
}

bool is_hex_of(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool is_safe_etag(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) return false;
  return true;
}

// ---- per-model lock --------------------------------------------------------

std::string model_lock_path(const std::string& model_name_or_path, const std::string& cache_dir) {
  return lock_file_path(model_name_or_path, cache_dir);
}

Result<ModelLock> ModelLock::acquire(const std::string& model_name_or_path, const std::string& cache_dir) {
  auto lock = std::make_unique<CrossProcessLock>(get_lock(model_name_or_path, cache_dir));
  WL_RETURN_IF_ERROR(lock->acquire());
  return ModelLock(std::move(lock));
}

ModelLock::~ModelLock() = default;

}  // namespace wl

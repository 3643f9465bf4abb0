// Writes confined below registered directories: the walk that never follows
// a symbolic link (see confined.h).
#include "io/confined.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include <fmt/format.h>

namespace wl::confined {
namespace {

std::shared_mutex roots_mu;
std::vector<std::string>& roots() {
  static std::vector<std::string> r;
  return r;
}

// "a//b/" -> "a/b": the form paths are compared in.
std::string normalized(const std::string& p) {
  std::string out;
  for (char c : p)
    if (!(c == '/' && !out.empty() && out.back() == '/')) out += c;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

}  // namespace

void add_root(const std::string& dir) {
  const std::string d = normalized(dir);
  if (d.empty()) return;
  std::unique_lock lk(roots_mu);
  for (const auto& r : roots())
    if (r == d) return;
  roots().push_back(d);
}

Status planted_link(const std::string& path) {
  return Status::PermissionDenied(
             "is a symbolic link where weightlift writes its cache; refusing to write through it (in a shared cache "
             "another user may have planted it); remove it to go on")
      .with_file(path);
}

Result<Parent> parent_of(const std::string& path, bool create, unsigned mode) {
  const std::string p = normalized(path);
  std::string root;
  {
    std::shared_lock lk(roots_mu);
    for (const auto& r : roots())  // the longest registered directory `p` lies below
      if (p.size() > r.size() && p.compare(0, r.size(), r) == 0 && (p[r.size()] == '/' || r == "/") &&
          r.size() > root.size())
        root = r;
  }
  Parent out;
  if (root.empty()) {
    out.name = path;
    return out;
  }
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir && errno == ENOENT && create) {  // the registered directory itself: the caller's choice, made as asked
    size_t i = 0;
    do {
      i = root.find('/', i + 1);
      const std::string up = root.substr(0, i);
      if (::mkdir(up.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
        return Status::FromErrno(errno, "cannot create directory").with_file(up);
    } while (i != std::string::npos);
    dir = UniqueFd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  }
  if (!dir) return Status::FromErrno(errno, "cannot open directory").with_file(root);
  std::string rel = p.substr(root == "/" ? 1 : root.size() + 1), at = root;
  for (;;) {
    const size_t slash = rel.find('/');
    const std::string comp = rel.substr(0, slash);
    if (comp == "..") return Status::PermissionDenied("'..' below a cache directory: refusing to write").with_file(p);
    if (slash == std::string::npos) {
      out.fd = std::move(dir);
      out.name = comp;
      return out;
    }
    rel = rel.substr(slash + 1);
    at += "/" + comp;
    if (comp == ".") continue;
    if (create && ::mkdirat(dir.get(), comp.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, "cannot create directory").with_file(at);
    int fd = ::openat(dir.get(), comp.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      struct stat st {};
      if (::fstatat(dir.get(), comp.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
        return planted_link(at);
      return Status::FromErrno(err, "cannot open directory").with_file(at);
    }
    dir = UniqueFd(fd);
  }
}

}  // namespace wl::confined

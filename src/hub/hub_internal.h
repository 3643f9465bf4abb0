// Private helpers shared by src/hub/*.cpp.
#pragma once

#include <string>

#include "weightlift/hub.h"

namespace wl {

Status check_repo_id(const std::string& repo_id);
Status check_revision(const std::string& rev);
bool is_commit_hash(const std::string& s);
bool is_safe_etag(const std::string& s);
Status make_dirs(const std::string& path);

// An exclusive flock on a file (huggingface_hub's filelock uses flock too, so
// the two tools exclude each other). Released on destruction.
class FileLock {
 public:
  static Result<FileLock> acquire(const std::string& path);
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace wl

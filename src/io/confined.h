// Private: writes confined below a directory (Env::confine_writes). The POSIX
// Env resolves the parent of every path it writes through parent_of(): below
// a registered directory each component is opened with O_NOFOLLOW, one at a
// time, so a symbolic link planted there is refused instead of followed.
#pragma once

#include <fcntl.h>

#include <string>

#include "io/unique_fd.h"
#include "weightlift/status.h"

namespace wl::confined {

// Registers `dir` (process-wide; idempotent; thread-safe).
void add_root(const std::string& dir);

// The directory an operation on `path` acts in, and the name it acts on.
// Below a registered directory: `fd` is that directory (O_PATH), reached
// without following any link, `name` the last component. Elsewhere: `fd` is
// empty, at() is AT_FDCWD and `name` the whole path (the kernel resolves it).
struct Parent {
  UniqueFd fd;
  std::string name;
  int at() const { return fd ? fd.get() : AT_FDCWD; }
};

// `create`: missing directories below the registered one are made (mode
// minus umask) on the way. kPermissionDenied names a component that is a
// symbolic link or '..'.
Result<Parent> parent_of(const std::string& path, bool create = false, unsigned mode = 0755);

// The message for a write refused at `path` because it is a symbolic link.
Status planted_link(const std::string& path);

}  // namespace wl::confined

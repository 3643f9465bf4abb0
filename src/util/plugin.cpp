#include "util/plugin.h"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

namespace wl {

std::vector<std::string> plugin_candidates(const char* name, const char* env_var, const void* anchor) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(env_var); env && *env) candidates.push_back(env);
  Dl_info info{};
  link_map* map = nullptr;
  if (::dladdr1(anchor, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) && info.dli_fname) {
    std::string path = info.dli_fname;
    // In the main program dladdr names argv[0], which may be a bare command
    // name found on $PATH (or anything the caller passed): ask the kernel.
    if (map && map->l_name && map->l_name[0] == '\0') {
      char exe[4096];
      ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
      if (n > 0) path.assign(exe, static_cast<size_t>(n));
    }
    auto pos = path.rfind('/');
    std::string dir = pos == std::string::npos ? "." : path.substr(0, pos);
    candidates.push_back(dir + "/" + name);
    candidates.push_back(dir + "/../lib/" + name);
  }
  candidates.push_back(name);
  return candidates;
}

void* open_plugin(const std::vector<std::string>& candidates, int dlopen_flags, std::string* errors) {
  for (const auto& c : candidates) {
    if (void* handle = ::dlopen(c.c_str(), dlopen_flags)) return handle;
    if (const char* e = ::dlerror(); e && errors) *errors += fmt::format("\n  {}: {}", c, e);
  }
  return nullptr;
}

}  // namespace wl

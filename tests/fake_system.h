// A SystemInfo whose answers a test sets (mount table, meminfo, cgroup files,
// /proc/self texts); unset answers are kNotFound.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "weightlift/system.h"

namespace wl::testing {

class FakeSystemInfo final : public SystemInfo {
 public:
  std::optional<std::string> mounts_text, meminfo_text, status_text, io_text;
  std::map<std::string, std::string> cgroup;

  Result<std::string> mounts() override { return get(mounts_text, "/proc/mounts"); }
  Result<std::string> meminfo() override { return get(meminfo_text, "/proc/meminfo"); }
  Result<std::string> cgroup_file(std::string_view name) override {
    auto it = cgroup.find(std::string(name));
    if (it == cgroup.end()) return Status::NotFound("no such cgroup file").with_file(name);
    return it->second;
  }
  Result<std::string> self_status() override { return get(status_text, "/proc/self/status"); }
  Result<std::string> self_io() override { return get(io_text, "/proc/self/io"); }
  std::string real_path(const std::string& path) override { return path; }

 private:
  static Result<std::string> get(const std::optional<std::string>& v, const char* name) {
    if (!v) return Status::NotFound("cannot read").with_file(name);
    return *v;
  }
};

}  // namespace wl::testing

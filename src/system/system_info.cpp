// SystemInfo over /proc and /sys, and the parsers every policy shares.
#include "weightlift/system.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/memory_admission.h"

namespace wl {

namespace {

Result<std::string> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read").with_file(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ProcSystemInfo final : public SystemInfo {
 public:
  Result<std::string> mounts() override { return slurp("/proc/mounts"); }
  Result<std::string> meminfo() override { return slurp("/proc/meminfo"); }
  Result<std::string> cgroup_file(std::string_view name) override {
    return slurp("/sys/fs/cgroup/" + std::string(name));
  }
  Result<std::string> self_status() override { return slurp("/proc/self/status"); }
  Result<std::string> self_io() override { return slurp("/proc/self/io"); }
  std::string real_path(const std::string& path) override {
    std::string out = path;
    if (char* r = ::realpath(path.c_str(), nullptr)) {
      out = r;
      std::free(r);
    }
    return out;
  }
};

std::string unescape_mount(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::optional<uint64_t> parse_u64(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty() || s == "max") return std::nullopt;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') return std::nullopt;
  return static_cast<uint64_t>(v);
}

// The number after "key:" on its own line, and the unit word after it.
std::optional<std::pair<unsigned long long, std::string>> keyed_line(std::string_view text, std::string_view key) {
  std::istringstream in{std::string(text)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
    std::istringstream ss(line.substr(key.size() + 1));
    unsigned long long v = 0;
    std::string unit;
    if (!(ss >> v)) return std::make_pair(ULLONG_MAX, std::string("?"));
    ss >> unit;
    return std::make_pair(v, unit);
  }
  return std::nullopt;
}

}  // namespace

SystemInfo* SystemInfo::Default() {
  static ProcSystemInfo sys;
  return &sys;
}

Result<uint64_t> parse_mem_available(std::string_view meminfo, std::string_view source) {
  auto kv = keyed_line(meminfo, "MemAvailable");
  if (!kv) return Status::Corrupt("no MemAvailable line").with_file(source);
  if (kv->second == "?" || kv->first > (ULLONG_MAX >> 10))
    return Status::Corrupt("malformed MemAvailable line").with_file(source);
  if (!kv->second.empty() && kv->second != "kB")
    return Status::Corrupt(fmt::format("MemAvailable unit '{}' is not kB", kv->second)).with_file(source);
  return static_cast<uint64_t>(kv->first) * 1024;
}

std::optional<uint64_t> parse_status_kb(std::string_view status, std::string_view key) {
  auto kv = keyed_line(status, key);
  if (!kv || kv->second == "?" || kv->first > (ULLONG_MAX >> 10)) return std::nullopt;
  return static_cast<uint64_t>(kv->first) * 1024;
}

std::optional<uint64_t> parse_io_counter(std::string_view io, std::string_view key) {
  auto kv = keyed_line(io, key);
  if (!kv || kv->second == "?") return std::nullopt;
  return static_cast<uint64_t>(kv->first);
}

Result<uint64_t> available_ram_bytes(SystemInfo* sys) {
  WL_ASSIGN_OR_RETURN(std::string meminfo, sys->meminfo());
  WL_ASSIGN_OR_RETURN(uint64_t avail, parse_mem_available(meminfo));
  auto max = sys->cgroup_file("memory.max");
  auto cur = sys->cgroup_file("memory.current");
  if (max.ok() && cur.ok()) {
    auto m = parse_u64(*max), c = parse_u64(*cur);
    if (m && c) avail = std::min<uint64_t>(avail, *m > *c ? *m - *c : 0);
  }
  return avail;
}

std::string filesystem_type(const std::string& path, SystemInfo* sys) {
  const std::string resolved = sys->real_path(path);
  auto table = sys->mounts();
  if (!table.ok()) return "";
  std::istringstream in(*table);
  std::string line, best_mount, best_type;
  bool found = false;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string dev, mnt, type;
    if (!(ss >> dev >> mnt >> type)) continue;
    mnt = unescape_mount(mnt);
    std::string with_slash = mnt.back() == '/' ? mnt : mnt + "/";
    bool match = resolved == mnt || resolved.rfind(with_slash, 0) == 0;
    if (match && (!found || mnt.size() >= best_mount.size())) {
      found = true;
      best_mount = mnt;
      best_type = type;
    }
  }
  return best_type;
}

bool is_network_filesystem(std::string_view t) { return t == "nfs" || t == "nfs4" || t == "lustre"; }

uint64_t peak_rss_bytes(SystemInfo* sys) {
  auto s = sys->self_status();
  if (!s.ok()) return 0;
  return parse_status_kb(*s, "VmHWM").value_or(0);
}

uint64_t storage_read_bytes(SystemInfo* sys) {
  auto s = sys->self_io();
  if (!s.ok()) return 0;
  return parse_io_counter(*s, "read_bytes").value_or(0);
}

Result<uint64_t> memory_available_for_buffers() { return available_ram_bytes(); }

}  // namespace wl

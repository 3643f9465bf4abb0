// weightlift/system.h: what the engine asks of the running system (mount
// table, free memory, cgroup limits, this process's counters), behind one
// injectable interface so that policies (auto prefetch, memory caps) and
// measurements (peak RSS, bytes read from storage) can be tested with fakes.
//
// Thread-safety: every method may be called from many threads at once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "weightlift/status.h"

namespace wl {

class SystemInfo {
 public:
  virtual ~SystemInfo() = default;
  // The process-wide implementation reading /proc and /sys.
  static SystemInfo* Default();

  // The mount table (/proc/mounts text).
  virtual Result<std::string> mounts() = 0;
  // /proc/meminfo text.
  virtual Result<std::string> meminfo() = 0;
  // A file of this process's cgroup v2 directory ("memory.max",
  // "memory.current"); kNotFound when there is none.
  virtual Result<std::string> cgroup_file(std::string_view name) = 0;
  // /proc/self/status text (VmHWM, VmRSS).
  virtual Result<std::string> self_status() = 0;
  // /proc/self/io text (read_bytes: bytes this process caused to be read from storage).
  virtual Result<std::string> self_io() = 0;
  // realpath(3) of a local path (symlinks resolved); the path itself when it
  // cannot be resolved.
  virtual std::string real_path(const std::string& path) = 0;
};

// Parsers over the texts above (pure; errors name `source` when given).
// "MemAvailable" of meminfo in bytes.
Result<uint64_t> parse_mem_available(std::string_view meminfo, std::string_view source = "/proc/meminfo");
// A "Key:  123 kB" line of a status file, in bytes; nullopt when absent.
std::optional<uint64_t> parse_status_kb(std::string_view status, std::string_view key);
// A "key: 123" line of /proc/self/io; nullopt when absent.
std::optional<uint64_t> parse_io_counter(std::string_view io, std::string_view key);

// MemAvailable, capped by the cgroup v2 limit (memory.max - memory.current).
Result<uint64_t> available_ram_bytes(SystemInfo* sys = SystemInfo::Default());
// The filesystem type serving `path` by the longest mount-point prefix of the
// mount table ("" when none matches or the table cannot be read). Octal
// escapes ("\040") in mount points are decoded.
std::string filesystem_type(const std::string& path, SystemInfo* sys = SystemInfo::Default());
bool is_network_filesystem(std::string_view fstype);  // nfs, nfs4, lustre
// Peak resident set size of this process, in bytes (VmHWM); 0 when unknown.
uint64_t peak_rss_bytes(SystemInfo* sys = SystemInfo::Default());
// Bytes this process has read from storage so far (/proc/self/io read_bytes); 0 when unknown.
uint64_t storage_read_bytes(SystemInfo* sys = SystemInfo::Default());

}  // namespace wl

#include "gpu/gds_platform.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "weightlift/switches.h"

namespace wl::gpu {

namespace {

std::string read_text(const std::string& path, size_t cap = size_t{4} << 20) {
  std::ifstream f(path);
  if (!f) return {};
  std::string out;
  char buf[8192];
  while (out.size() < cap && f.read(buf, sizeof buf).gcount() > 0) out.append(buf, static_cast<size_t>(f.gcount()));
  return out;
}

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// The disk kind of block device MAJ:MIN, looking through md / dm to the
// disks beneath (all NVMe: "nvme"). Depth-limited.
std::string disk_kind(unsigned maj, unsigned min, int depth = 0) {
  char real[PATH_MAX];
  const std::string link = fmt::format("/sys/dev/block/{}:{}", maj, min);
  if (!::realpath(link.c_str(), real)) return {};
  std::string path = real;
  std::string kind = disk_kind_of_sysfs_path(path);
  if ((kind != "md" && kind != "dm") || depth > 4) return kind;
  // Each entry of slaves/ is a block device under this one (nvme0n1, sda, dm-1);
  // a partition of an md device has them on its parent.
  std::string dir = path;
  if (!exists(dir + "/slaves") && exists(dir + "/partition")) dir = dir.substr(0, dir.rfind('/'));
  std::vector<std::string> under;
  if (DIR* d = ::opendir((dir + "/slaves").c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string dev = read_text("/sys/class/block/" + name + "/dev");
      unsigned a = 0, b = 0;
      if (std::sscanf(dev.c_str(), "%u:%u", &a, &b) == 2) under.push_back(disk_kind(a, b, depth + 1));
    }
    ::closedir(d);
  }
  if (under.empty()) return kind;
  for (const auto& k : under)
    if (k != "nvme") return kind + " over " + k;
  return "nvme";
}

bool any_of(std::string_view s, std::initializer_list<std::string_view> set) {
  for (auto x : set)
    if (s == x) return true;
  return false;
}

bool local_block_fs(std::string_view fs) { return any_of(fs, {"ext4", "xfs"}); }
bool network_fs(std::string_view fs) { return any_of(fs, {"nfs", "nfs4", "lustre", "gpfs", "wekafs", "beegfs"}); }

}  // namespace

std::string fs_type_in_mountinfo(std::string_view text, uint64_t dev) {
  const std::string want = fmt::format("{}:{}", major(static_cast<dev_t>(dev)), minor(static_cast<dev_t>(dev)));
  std::string type;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    // "36 35 98:0 /root /mnt rw,noatime master:1 - ext4 /dev/root rw"
    std::istringstream in{std::string(line)};
    std::string id, parent, majmin;
    if (!(in >> id >> parent >> majmin) || majmin != want) continue;
    size_t sep = line.find(" - ");
    if (sep == std::string_view::npos) continue;
    std::istringstream rest{std::string(line.substr(sep + 3))};
    std::string t;
    if (rest >> t) type = t;  // the last mount of the device wins (they agree)
  }
  return type;
}

std::string disk_kind_of_sysfs_path(std::string_view path) {
  // The disk's own name: the component after ".../block/", else the last.
  std::string_view name = path;
  if (size_t b = path.rfind("/block/"); b != std::string_view::npos) {
    name = path.substr(b + 7);
    if (size_t s = name.find('/'); s != std::string_view::npos) name = name.substr(0, s);
  } else if (size_t s = path.rfind('/'); s != std::string_view::npos) {
    name = path.substr(s + 1);
  }
  if (name.starts_with("nvme") || path.find("/nvme") != std::string_view::npos) return "nvme";
  if (name.starts_with("md")) return "md";
  if (name.starts_with("dm-")) return "dm";
  if (name.starts_with("vd") || path.find("/virtio") != std::string_view::npos) return "virtio";
  if (name.starts_with("xvd")) return "xen";
  if (name.starts_with("sd")) return "scsi";
  if (name.starts_with("loop")) return "loop";
  if (name.starts_with("zram") || name.starts_with("ram") || name.starts_with("pmem")) return "memory";
  if (name.starts_with("rbd")) return "rbd";
  return name.empty() ? std::string() : std::string(name);
}

bool cufile_json_enables_p2pdma(std::string_view json) {
  // Drop // comments outside strings (cufile.json has them), then look for the key.
  std::string clean;
  clean.reserve(json.size());
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (in_string) {
      clean += c;
      if (c == '\\' && i + 1 < json.size())
        clean += json[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '/' && i + 1 < json.size() && json[i + 1] == '/') {
      while (i < json.size() && json[i] != '\n') ++i;
      clean += '\n';
      continue;
    }
    clean += c;
  }
  static const std::regex key(R"re("use_pci_p2pdma"\s*:\s*true)re");
  return std::regex_search(clean, key);
}

GdsPlatform probe_platform(int fd) {
  GdsPlatform p;
  struct stat st {};
  if (fd >= 0 && ::fstat(fd, &st) == 0) {
    p.fs_id = static_cast<uint64_t>(st.st_dev);
    p.fs_type = fs_type_in_mountinfo(read_text("/proc/self/mountinfo"), p.fs_id);
    if (major(st.st_dev) != 0) p.disk = disk_kind(major(st.st_dev), minor(st.st_dev));
  }
  p.nvidia_fs = exists("/proc/driver/nvidia-fs/version") || exists("/sys/module/nvidia_fs");
  p.p2pdma = cufile_json_enables_p2pdma(read_text(read_switches().cufile_config, 1 << 20));
  return p;
}

std::string platform_refusal(const GdsPlatform& p) {
  if (p.fs_type.empty()) return "the file's filesystem could not be identified";
  if (local_block_fs(p.fs_type)) {
    if (p.disk != "nvme")
      return fmt::format("GPUDirect Storage reads {} only from NVMe disks, and this one is {}", p.fs_type,
                         p.disk.empty() ? "unknown" : p.disk);
  } else if (!network_fs(p.fs_type)) {
    return fmt::format("GPUDirect Storage does not read from {}", p.fs_type);
  }
  if (!p.nvidia_fs && !(p.p2pdma && p.disk == "nvme"))
    return "the nvidia-fs kernel driver is not loaded (cuFile could only read through its compatibility path: "
           "POSIX reads and a copy)";
  return {};
}

std::string properties_refusal(const WlCuFileDrvProps& props, const GdsPlatform& p) {
  const unsigned flags = props.nvfs.dstatusflags;
  auto has = [&](int bit) { return (flags >> bit) & 1u; };
  const bool nvfs = props.nvfs.major_version != 0 || props.nvfs.minor_version != 0;
  if (!nvfs && !has(kCuFileNvmeP2pSupported))
    return "cuFile reports neither the nvidia-fs driver nor NVMe P2PDMA (compatibility mode only)";
  bool served = false;
  if (local_block_fs(p.fs_type))
    served = has(kCuFileNvmeSupported) || has(kCuFileNvmeofSupported) || has(kCuFileNvmeP2pSupported);
  else if (p.fs_type == "lustre")
    served = has(kCuFileLustreSupported);
  else if (p.fs_type == "wekafs")
    served = has(kCuFileWekafsSupported);
  else if (p.fs_type == "nfs" || p.fs_type == "nfs4")
    served = has(kCuFileNfsSupported);
  else if (p.fs_type == "gpfs")
    served = has(kCuFileGpfsSupported);
  else if (p.fs_type == "beegfs")
    served = has(kCuFileBeegfsSupported);
  if (!served)
    return fmt::format("cuFile does not read {} GPU-direct on this machine (driver status flags {:#x})", p.fs_type,
                       flags);
  return {};
}

}  // namespace wl::gpu

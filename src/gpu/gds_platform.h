// Private: can GPUDirect Storage read this file straight into device memory?
//
// cuFile accepts files it can only read in compatibility mode (POSIX reads
// into its own bounce buffer, then a copy) and opening it costs a fixed
// fraction of a second per process (cuFileDriverOpen). So `--gds auto` first
// asks the platform, without opening cuFile:
//   the filesystem  local ext4 / xfs on an NVMe disk (or md / dm over NVMe),
//                   or a filesystem GDS serves over the network (NFS, Lustre,
//                   GPFS, WekaFS, BeeGFS); anything else (tmpfs, overlay,
//                   btrfs, a virtio or SCSI disk...) never reads GPU-direct
//   the driver      the nvidia-fs kernel module is loaded, or cufile.json
//                   enables the kernel's PCI P2PDMA mode
// and only then opens cuFile and checks its driver properties (an nvidia-fs
// version, or NVMe P2PDMA support). The verdict is cached per device and
// filesystem (st_dev) for the life of the process (gds.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpu/cuda_abi.h"

namespace wl::gpu {

struct GdsPlatform {
  uint64_t fs_id = 0;      // st_dev of the file
  std::string fs_type;     // from /proc/self/mountinfo: "ext4", "xfs", "nfs4", "lustre", "tmpfs"... ("" unknown)
  std::string disk;        // a local filesystem's disk: "nvme", "virtio", "scsi", "md", "dm", "loop"... ("" none)
  bool nvidia_fs = false;  // the nvidia-fs kernel driver is loaded
  bool p2pdma = false;     // cufile.json sets "use_pci_p2pdma": true (GDS without nvidia-fs, NVMe only)
};

// The platform facts of an open file (its descriptor): statfs-free, from
// /proc and /sys (a fact that cannot be read stays empty / false).
GdsPlatform probe_platform(int fd);

// Why GPU-direct reads of a file on `p` cannot work, "" when they may
// (cuFile's driver properties decide then).
std::string platform_refusal(const GdsPlatform& p);
// Why cuFile, opened, would only read in compatibility mode: no nvidia-fs
// version and no NVMe P2PDMA support; "" when its driver reads GPU-direct.
std::string properties_refusal(const WlCuFileDrvProps& props, const GdsPlatform& p);

// Exposed for tests: the filesystem type of device `dev` in mountinfo text;
// the kind of a block device from its sysfs path (…/nvme0n1, …/virtio2/block/vda);
// whether cufile.json text enables P2PDMA (comments allowed).
std::string fs_type_in_mountinfo(std::string_view mountinfo, uint64_t dev);
std::string disk_kind_of_sysfs_path(std::string_view path);
bool cufile_json_enables_p2pdma(std::string_view json);

}  // namespace wl::gpu

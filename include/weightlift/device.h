// weightlift/device.h: where bytes live. The values are DLPack's device
// types, so a Device crosses to torch/numpy unchanged.
// Values; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "weightlift/status.h"

namespace wl {

enum class DeviceKind : int32_t {
  kCpu = 1,       // pageable host memory
  kCuda = 2,      // CUDA device memory (not addressable from the host)
  kCudaHost = 3,  // pinned (page-locked) host memory, addressable from host and device
};

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int32_t index = 0;  // the CUDA ordinal; 0 for host memory

  // Host code may read and write the bytes directly.
  bool host_accessible() const { return kind != DeviceKind::kCuda; }
  bool operator==(const Device&) const = default;
  // "cpu", "pinned", "cuda:N".
  std::string to_string() const;
};

inline constexpr Device kCpu{};

// "cpu", "pinned" (or "cuda_host"), "cuda" (= "cuda:0"; the Python face
// passes the current device explicitly), "cuda:N". Bad text is kInvalidArgument.
Result<Device> parse_device(std::string_view text);

}  // namespace wl

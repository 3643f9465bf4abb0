#include "weightlift/device.h"

#include <charconv>

#include <fmt/format.h>

namespace wl {

std::string Device::to_string() const {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCudaHost: return "pinned";
    case DeviceKind::kCuda: return fmt::format("cuda:{}", index);
  }
  return "?";
}

Result<Device> parse_device(std::string_view text) {
  if (text == "cpu") return Device{};
  if (text == "pinned" || text == "cuda_host") return Device{DeviceKind::kCudaHost, 0};
  if (text == "cuda") return Device{DeviceKind::kCuda, 0};
  if (text.starts_with("cuda:")) {
    std::string_view n = text.substr(5);
    int32_t idx = -1;
    auto [p, ec] = std::from_chars(n.data(), n.data() + n.size(), idx);
    if (ec == std::errc() && p == n.data() + n.size() && idx >= 0 && !n.empty()) return Device{DeviceKind::kCuda, idx};
  }
  return Status::InvalidArgument(fmt::format("unknown device '{}' (expected cpu, pinned, cuda or cuda:N)", text));
}

}  // namespace wl

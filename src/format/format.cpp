// The CheckpointFormat record's matching (weightlift/format.h).
#include "weightlift/format.h"

#include <cstring>

namespace wl {

bool CheckpointFormat::claims_name(std::string_view path) const {
  for (std::string_view ext : extensions)
    if (path.ends_with(ext)) return true;
  return false;
}

bool CheckpointFormat::claims_head(std::span<const std::byte> head) const {
  for (std::string_view magic : magics)
    if (!magic.empty() && head.size() >= magic.size() && std::memcmp(head.data(), magic.data(), magic.size()) == 0)
      return true;
  return false;
}

}  // namespace wl

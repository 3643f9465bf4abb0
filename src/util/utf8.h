// Strict UTF-8 validation (no overlongs, no surrogates, <= U+10FFFF).
#pragma once

#include <string_view>

namespace wl {
bool is_valid_utf8(std::string_view s);
}

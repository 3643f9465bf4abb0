// Names that come from a listing, checked before they name a file on disk.
#pragma once

#include <string>
#include <string_view>

#include "weightlift/text.h"

namespace wl::s3names {

// Why `rel` is not a plain relative path (empty when it is one): empty or
// absolute, a backslash, a control character (text.h's has_control_chars: C0,
// DEL, C1, the Unicode format controls, bytes that are not UTF-8), an empty,
// '.' or '..' component.
inline std::string relative_path_problem(std::string_view rel) {
  if (rel.empty() || rel.front() == '/') return "it is empty or absolute";
  if (rel.find('\\') != std::string_view::npos) return "it holds a backslash";
  if (has_control_chars(rel)) return "it holds a control character or bytes that are not UTF-8";
  for (size_t a = 0; a <= rel.size();) {
    size_t b = rel.find('/', a);
    if (b == std::string_view::npos) b = rel.size();
    const std::string_view part = rel.substr(a, b - a);
    if (part.empty() || part == "." || part == "..") return "it has an empty, '.' or '..' component";
    a = b + 1;
  }
  return {};
}

// `s` cut to 256 bytes and made inert (text.h): safe in a message.
inline std::string printable_name(std::string_view s) { return inert(s, 256); }

}  // namespace wl::s3names

// Names that come from a listing, checked before they name a file on disk.
#pragma once

#include <string>
#include <string_view>

namespace wl::s3names {

// Why `rel` is not a plain relative path (empty when it is one): empty or
// absolute, a backslash, a control character, an empty, '.' or '..' component.
inline std::string relative_path_problem(std::string_view rel) {
  if (rel.empty() || rel.front() == '/') return "it is empty or absolute";
  for (char c : rel) {
    if (c == '\\') return "it holds a backslash";
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "it holds a control character";
  }
  for (size_t a = 0; a <= rel.size();) {
    size_t b = rel.find('/', a);
    if (b == std::string_view::npos) b = rel.size();
    const std::string_view part = rel.substr(a, b - a);
    if (part.empty() || part == "." || part == "..") return "it has an empty, '.' or '..' component";
    a = b + 1;
  }
  return {};
}

// `s` cut to 256 bytes with control characters shown as '?': safe in a message.
inline std::string printable_name(std::string_view s) {
  std::string shown;
  for (char c : s.substr(0, 256)) shown.push_back(static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c);
  return shown;
}

}  // namespace wl::s3names

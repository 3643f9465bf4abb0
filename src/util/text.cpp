#include "weightlift/text.h"

#include <array>
#include <cstdint>

#include <fmt/format.h>

namespace wl {

namespace {

// One UTF-8 sequence at p (strictly: no overlongs, no surrogates, <= U+10FFFF).
// Returns its length and sets *cp, or 0 when the bytes there are not UTF-8.
size_t decode_utf8(const unsigned char* p, const unsigned char* end, uint32_t* cp) {
  const unsigned char c = *p;
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if ((c & 0xE0) == 0xC0) {
    n = 1, v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 2, v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 3, v = c & 0x07;
  } else {
    return 0;
  }
  if (static_cast<size_t>(end - p) <= n) return 0;
  for (size_t i = 1; i <= n; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3F);
  }
  if ((n == 1 && v < 0x80) || (n == 2 && v < 0x800) || (n == 3 && v < 0x10000)) return 0;
  if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n + 1;
}

// Code points above ASCII that a terminal acts on or that reorder, hide or
// break the text around them.
bool is_control_code_point(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F || (cp >= 0x2028 && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

bool is_c0_or_del(unsigned char c) { return c < 0x20 || c == 0x7F; }

// Where a URL's authority (or a query value) ends inside running text.
bool ends_url_part(char c) {
  return c == '/' || c == '?' || c == '#' || c == ' ' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' ||
         is_c0_or_del(static_cast<unsigned char>(c));
}
bool ends_query_value(char c) {
  return c == '&' || c == '#' || c == ' ' || c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' || c == ')' ||
         c == ';' || is_c0_or_del(static_cast<unsigned char>(c));
}
bool is_param_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == '~' || c == '%';
}

bool is_secret_param(std::string_view name) {
  std::string low;
  low.reserve(name.size());
  for (char c : name) low.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  static constexpr std::array<std::string_view, 4> kExact = {"sig", "key", "auth", "authorization"};
  static constexpr std::array<std::string_view, 11> kHolds = {"signature", "credential", "token",     "secret",
                                                              "password",  "passwd",     "apikey",    "api_key",
                                                              "api-key",   "accesskey",  "access_key"};
  for (auto e : kExact)
    if (low == e) return true;
  for (auto h : kHolds)
    if (low.find(h) != std::string::npos) return true;
  return false;
}

constexpr std::string_view kRedacted = "***";

// Replaces the userinfo of every scheme://userinfo@host in `s`.
std::string redact_userinfo(std::string_view s) {
  std::string out;
  size_t from = 0;
  for (size_t i = s.find("://"); i != std::string_view::npos; i = s.find("://", i + 3)) {
    const size_t begin = i + 3;
    size_t end = begin;
    while (end < s.size() && !ends_url_part(s[end])) ++end;
    const size_t at = s.substr(begin, end - begin).rfind('@');
    if (at == std::string_view::npos || s.substr(begin, at) == kRedacted) continue;
    out.append(s.substr(from, begin - from)).append(kRedacted);
    from = begin + at;  // keeps the '@'
  }
  if (from == 0) return std::string(s);
  out.append(s.substr(from));
  return out;
}

// Replaces the value of every secret query parameter (?name=value, &name=value).
std::string redact_params(std::string_view s) {
  std::string out;
  size_t from = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '?' && s[i] != '&') continue;
    size_t eq = i + 1;
    while (eq < s.size() && is_param_name_char(s[eq])) ++eq;
    if (eq == i + 1 || eq >= s.size() || s[eq] != '=') continue;
    if (!is_secret_param(s.substr(i + 1, eq - i - 1))) continue;
    size_t end = eq + 1;
    while (end < s.size() && !ends_query_value(s[end])) ++end;
    if (s.substr(eq + 1, end - eq - 1) == kRedacted) continue;
    out.append(s.substr(from, eq + 1 - from)).append(kRedacted);
    from = end;
    i = end - 1;
  }
  if (from == 0) return std::string(s);
  out.append(s.substr(from));
  return out;
}

// Printable ASCII with nothing to redact (no '@' of a userinfo, no '=' of a
// query value): the common case, returned as it is after one pass.
bool plain(std::string_view s) {
  for (char c : s)
    if (c < 0x20 || c > 0x7E || c == '@' || c == '=') return false;
  return true;
}

}  // namespace

std::string escape_controls(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  std::string out;
  out.reserve(s.size());
  while (p < end) {
    if (*p >= 0x20 && *p < 0x7F) {
      out.push_back(static_cast<char>(*p++));
      continue;
    }
    uint32_t cp = 0;
    const size_t n = is_c0_or_del(*p) ? 0 : decode_utf8(p, end, &cp);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", *p++);  // a C0 byte, DEL, or a byte that is not UTF-8
    } else if (is_control_code_point(cp)) {
      out += fmt::format("\\u{:04x}", cp);
      p += n;
    } else {
      out.append(reinterpret_cast<const char*>(p), n);
      p += n;
    }
  }
  return out;
}

bool has_control_chars(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    if (*p >= 0x20 && *p < 0x7F) {
      ++p;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = is_c0_or_del(*p) ? 0 : decode_utf8(p, end, &cp);
    if (n == 0 || is_control_code_point(cp)) return true;
    p += n;
  }
  return false;
}

std::string redact_secrets(std::string_view s) {
  if (s.find("://") == std::string_view::npos && s.find('=') == std::string_view::npos) return std::string(s);
  return redact_params(redact_userinfo(s));
}

std::string inert(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes && plain(s)) return std::string(s);
  // Escaped first: an escape (\x1b) is printable, so a control character
  // inside a secret is redacted with it, and a second pass finds nothing new.
  std::string r = redact_secrets(escape_controls(s));
  if (r.size() <= max_bytes) return r;
  size_t keep = max_bytes;  // not inside a UTF-8 sequence, nor inside an escape
  while (keep > 0 && (static_cast<unsigned char>(r[keep]) & 0xC0) == 0x80) --keep;
  const size_t b = keep == 0 ? std::string::npos : r.rfind('\\', keep - 1);
  if (b != std::string::npos && b + 1 < r.size()) {
    const size_t len = r[b + 1] == 'x' ? 4 : r[b + 1] == 'u' ? 6 : 0;
    if (b + len > keep) keep = b;
  }
  r.resize(keep);
  return r + "...";
}

}  // namespace wl

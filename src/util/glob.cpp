// glob_match(): one pass over the name, remembering the last '*' to fall back to.
#include "weightlift/glob.h"

namespace wl {

namespace {

constexpr size_t kNone = std::string_view::npos;

// The index just past the bracket class opening at pat[p], or kNone when it
// has no closing ']' (the '[' is then a literal).
size_t class_end(std::string_view pat, size_t p) {
  size_t j = p + 1;
  if (j < pat.size() && pat[j] == '!') ++j;
  if (j < pat.size() && pat[j] == ']') ++j;  // a leading ']' belongs to the set
  while (j < pat.size() && pat[j] != ']') ++j;
  return j < pat.size() ? j + 1 : kNone;
}

// Whether c is in the class pat[p, end).
bool in_class(std::string_view pat, size_t p, size_t end, char c) {
  size_t k = p + 1;
  const size_t close = end - 1;
  const bool negate = pat[k] == '!';
  if (negate) ++k;
  bool found = false;
  while (k < close) {
    if (k + 2 < close && pat[k + 1] == '-') {
      found |= c >= pat[k] && c <= pat[k + 2];
      k += 3;
    } else {
      found |= c == pat[k];
      ++k;
    }
  }
  return found != negate;
}

// Whether the element at pat[p] (not '*') matches c; *next is the index past it.
bool element_matches(std::string_view pat, size_t p, char c, size_t* next) {
  *next = p + 1;
  if (pat[p] == '?') return true;
  if (pat[p] == '[') {
    if (size_t end = class_end(pat, p); end != kNone) {
      *next = end;
      return in_class(pat, p, end, c);
    }
  }
  return pat[p] == c;
}

}  // namespace

bool glob_match(std::string_view pat, std::string_view s) {
  size_t p = 0, i = 0, star = kNone, mark = 0;
  while (i < s.size()) {
    size_t next = 0;
    if (p < pat.size() && pat[p] == '*') {
      star = p++, mark = i;  // first try matching nothing
    } else if (p < pat.size() && element_matches(pat, p, s[i], &next)) {
      p = next, ++i;
    } else if (star != kNone) {
      p = star + 1, i = ++mark;  // the last '*' takes one more character
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
}

}  // namespace wl

// weightlift/glob.h: the one glob matcher of the library (shard rules, Hub
// allow/ignore patterns, object-store config patterns), with Python's
// fnmatch semantics (what vLLM and huggingface_hub use):
//   *        any run of characters, '/' included
//   ?        one character
//   [seq]    one character of seq (ranges a-z); [!seq] one not in it; a ']'
//            right after '[' or '[!' is part of seq; an unclosed '[' is literal
// Case-sensitive, no escapes. Linear in |pattern| x |name| (no exponential
// backtracking on hostile patterns). Pure; thread-safe.
#pragma once

#include <string_view>

namespace wl {

bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace wl

// JSON documents that decide which bytes are read (a safetensors index's
// weight_map, Hub and ModelScope listings, the cached tree listing, the NumPy
// cache's index), parsed so that every reader reads them one way: an object
// that repeats a key, at any depth, is refused instead of one of its values
// winning silently (nlohmann keeps the last, other readers the first).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace wl {

// The document, or nullopt with *error set to "not valid JSON: <parser's
// message>" or "duplicate key '<key>' in a JSON object" (the key made inert,
// text.h); callers wrap it in their kCorruptData naming the file or URL.
// Linear in the text (each key is looked up once in its object's map).
// Thread-safe.
std::optional<nlohmann::json> parse_json_strict(std::string_view text, std::string* error);

}  // namespace wl

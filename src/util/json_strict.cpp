#include "util/json_strict.h"

#include <vector>

#include <fmt/format.h>

#include "weightlift/text.h"

namespace wl {

namespace {

using json = nlohmann::json;

// nlohmann's DOM builder, plus a refusal of repeated keys (sax_parse takes any
// type with these members).
class StrictDom {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit StrictDom(json& root) : root_(root) {}

  std::string error;  // set when the parse stopped

  bool null() { return value(nullptr); }
  bool boolean(bool v) { return value(v); }
  bool number_integer(number_integer_t v) { return value(v); }
  bool number_unsigned(number_unsigned_t v) { return value(v); }
  bool number_float(number_float_t v, const string_t&) { return value(v); }
  bool string(string_t& v) { return value(std::move(v)); }
  bool binary(binary_t& v) { return value(json::binary(std::move(v))); }
  bool start_object(std::size_t) {
    stack_.push_back(place(json(json::value_t::object)));
    return true;
  }
  bool key(string_t& k) {
    auto [it, inserted] = stack_.back()->get_ref<json::object_t&>().try_emplace(k, nullptr);
    if (!inserted) {
      error = fmt::format("duplicate key '{}' in a JSON object", inert(k, 256));
      return false;
    }
    slot_ = &it->second;
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) {
    stack_.push_back(place(json(json::value_t::array)));
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) {
    error = fmt::format("not valid JSON: {}", inert(e.what()));
    return false;
  }

 private:
  template <class V>
  bool value(V&& v) {
    place(json(std::forward<V>(v)));
    return true;
  }
  // Puts `v` where the document expects the next value; returns where it went.
  json* place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* parent = stack_.back();
    if (parent->is_array()) {
      auto& a = parent->get_ref<json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  json& root_;
  std::vector<json*> stack_;  // the open containers, outermost first
  json* slot_ = nullptr;      // the value of the key just read
};

}  // namespace

std::optional<nlohmann::json> parse_json_strict(std::string_view text, std::string* error) {
  json root;
  StrictDom dom(root);
  bool ok = false;
  try {
    ok = json::sax_parse(text, &dom);
  } catch (const std::exception& e) {  // a value nlohmann cannot hold
    dom.error = fmt::format("not valid JSON: {}", inert(e.what()));
  }
  if (ok && dom.error.empty()) return root;
  if (error) *error = dom.error.empty() ? std::string("not valid JSON") : dom.error;
  return std::nullopt;
}

}  // namespace wl

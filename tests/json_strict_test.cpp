// JSON read one way (util/json_strict.h): what nlohmann parses, parsed the
// same; an object repeating a key, at any depth, refused with the key named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "util/json_strict.h"
#include "weightlift/text.h"

namespace wl {
namespace {

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

TEST(JsonStrict, ParsesWhatNlohmannParses) {
  const std::string doc = R"({"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"},"metadata":{"total_size":8},)"
                          R"("list":[1,-2,3.5,true,null,"s",{"k":[]},[[{}]]],"u":18446744073709551615,"x":"\u001b"})";
  std::string error;
  auto r = parse_json_strict(doc, &error);
  ASSERT_TRUE(r) << error;
  EXPECT_EQ(*r, nlohmann::json::parse(doc));
}

TEST(JsonStrict, ARepeatedKeyAtAnyDepthIsRefused) {
  for (std::string doc : {R"({"a":1,"a":2})", R"({"weight_map":{"w":"a.safetensors","w":"b.safetensors"}})",
                          R"({"weight_map":{},"weight_map":{"w":"a.safetensors"}})", R"([{"path":"a","path":"b"}])",
                          R"({"x":[1,{"y":{"z":1,"z":1}}]})", R"({"\u0061":1,"a":2})"}) {
    std::string error;
    ASSERT_FALSE(parse_json_strict(doc, &error)) << doc;
    EXPECT_TRUE(contains(error, "duplicate key")) << error;
  }
  std::string error;
  ASSERT_FALSE(parse_json_strict("{\"\\u001b[2J\":1,\"\\u001b[2J\":2}", &error));
  EXPECT_EQ(error, "duplicate key '\\x1b[2J' in a JSON object");  // inert (text.h)
  EXPECT_FALSE(parse_json_strict(R"({"a":1,"a":1})", nullptr));   // no error asked for
}

TEST(JsonStrict, InvalidJsonIsRefusedWithTheParsersWords) {
  for (std::string doc : {"", "{", "[1,]", "{\"a\":1}x", "{'a':1}", "nan"}) {
    std::string error;
    ASSERT_FALSE(parse_json_strict(doc, &error)) << doc;
    EXPECT_TRUE(error.starts_with("not valid JSON")) << error;
  }
}

}  // namespace
}  // namespace wl

// glob_match(): the one glob matcher (shard rules, Hub patterns, object-store
// config patterns), Python's fnmatch semantics.
#include <gtest/gtest.h>

#include <string>

#include "weightlift/glob.h"

namespace wl {
namespace {

TEST(Glob, StarAndQuestionMark) {
  EXPECT_TRUE(glob_match("*.safetensors", "model.safetensors"));
  EXPECT_TRUE(glob_match("*.safetensors", "original/x.safetensors"));  // '*' crosses '/'
  EXPECT_FALSE(glob_match("*.safetensors", "model.bin"));
  EXPECT_TRUE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(glob_match("layers.?.w", "layers.3.w"));
  EXPECT_FALSE(glob_match("layers.?.w", "layers.10.w"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "a"));
  EXPECT_FALSE(glob_match("?", ""));
  EXPECT_TRUE(glob_match("a*b*c", "aXbYbZc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXbYbZ"));
  EXPECT_TRUE(glob_match("**x", "yyx"));
}

TEST(Glob, BracketClasses) {
  EXPECT_TRUE(glob_match("a[0-9].bin", "a1.bin"));
  EXPECT_FALSE(glob_match("a[0-9].bin", "ab.bin"));
  EXPECT_FALSE(glob_match("a[!b].bin", "ab.bin"));
  EXPECT_TRUE(glob_match("a[!b].bin", "ac.bin"));
  EXPECT_TRUE(glob_match("a[]].bin", "a].bin"));  // ']' first is part of the set
  EXPECT_TRUE(glob_match("a[!]].bin", "ax.bin"));
  EXPECT_FALSE(glob_match("a[!]].bin", "a].bin"));
  EXPECT_TRUE(glob_match("a[.bin", "a[.bin"));  // an unclosed '[' is literal
  EXPECT_TRUE(glob_match("*[ab]", "xxb"));
  EXPECT_TRUE(glob_match("[a-cx]?", "xq"));
}

TEST(Glob, HostilePatternsStayLinear) {
  // A backtracking matcher takes exponential time here; ours makes one pass
  // per '*' restart (|pattern| x |name| at worst).
  const std::string name(20000, 'a');
  EXPECT_FALSE(glob_match("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", name));
  EXPECT_TRUE(glob_match("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a", name));
}

}  // namespace
}  // namespace wl

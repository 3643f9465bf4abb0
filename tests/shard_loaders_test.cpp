// Shard rules and layouts, the expert filter, and the reference's weight loaders.
#include <gtest/gtest.h>

#include <cstring>

#include "engine_test_util.h"
#include "weightlift/expert_filter.h"
#include "weightlift/shard.h"

namespace wl {
namespace {

using testing::make_f32;

TEST(ExpertFilter, ParsesIdsLikeTheReference) {
  EXPECT_EQ(parse_expert_id("model.layers.0.mlp.experts.42.gate_proj.weight"), 42);
  EXPECT_EQ(parse_expert_id("model.layers.60.mlp.experts.383.down_proj.weight"), 383);
  EXPECT_EQ(parse_expert_id("model.layers.5.mlp.experts.100.gate_proj.weight_scale"), 100);
  EXPECT_EQ(parse_expert_id("model.layers.0.mlp.experts.0.up_proj.weight"), 0);
  EXPECT_EQ(parse_expert_id("model.layers.0.mlp.shared_experts.gate_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("model.layers.0.self_attn.q_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("model.embed_tokens.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("model.layers.0.input_layernorm.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("model.layers.0.mlp.experts.gate_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("model.layers.10.mlp.experts.down_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_expert_id("x.experts.99999999999999999999999.w"), std::nullopt);
}

TEST(ExpertFilter, LocalIds) {
  EXPECT_EQ(*compute_local_expert_ids(64, 1, 0), std::nullopt);
  EXPECT_EQ(**compute_local_expert_ids(8, 2, 1), (std::set<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(**compute_local_expert_ids(10, 3, 0), (std::set<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(**compute_local_expert_ids(10, 3, 2), (std::set<int64_t>{7, 8, 9}));
  EXPECT_EQ(**compute_local_expert_ids(8, 3, 1, ExpertPlacement::kRoundRobin), (std::set<int64_t>{1, 4, 7}));
  EXPECT_EQ((**compute_local_expert_ids(2, 4, 3)).size(), 0u);
  auto bad = compute_local_expert_ids(8, 2, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rank 2 is outside [0, 2)"), std::string::npos);
  EXPECT_FALSE(compute_local_expert_ids(-1, 2, 0).ok());
}

TEST(ExpertFilter, SkipsOnlyRemoteExpertWeights) {
  std::optional<std::set<int64_t>> local = std::set<int64_t>{0, 1};
  EXPECT_TRUE(should_skip_weight("m.experts.5.up.weight", local));
  EXPECT_TRUE(should_skip_weight("m.experts.5.up.weight_packed", local));
  EXPECT_FALSE(should_skip_weight("m.experts.5.up.weight_scale", local));
  EXPECT_FALSE(should_skip_weight("m.experts.1.up.weight", local));
  EXPECT_FALSE(should_skip_weight("m.shared_experts.up.weight", local));
  EXPECT_FALSE(should_skip_weight("m.experts.up.weight", local));
  EXPECT_FALSE(should_skip_weight("m.experts.5.up.weight", std::nullopt));
}

TEST(ExpertFilter, ParsesIdLists) {
  EXPECT_EQ(*parse_expert_id_list("0-3,7"), (std::set<int64_t>{0, 1, 2, 3, 7}));
  EXPECT_EQ(*parse_expert_id_list("5"), (std::set<int64_t>{5}));
  for (const char* bad : {"", "a", "3-1", "1,,2", "-1", "0-99999999", "1-"}) {
    auto r = parse_expert_id_list(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_NE(parse_expert_id_list("3-1").status().message().find("reversed"), std::string::npos);
}

TEST(Shard, RulesAndGlobs) {
  auto r = parse_shard_rule("*.q_proj.weight:0");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pattern, "*.q_proj.weight");
  EXPECT_EQ(r->dim, 0);
  EXPECT_EQ(parse_shard_rule("a:b:-1")->pattern, "a:b");
  EXPECT_EQ(parse_shard_rule("a:b:-1")->dim, -1);
  for (const char* bad : {"abc", ":0", "a:", "a:x", "a:1.5", "a:999"}) {
    auto b = parse_shard_rule(bad);
    EXPECT_EQ(b.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find(bad), std::string::npos);
  }
  EXPECT_TRUE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(glob_match("*.q_proj.weight", "model.layers.0.self_attn.q_proj.bias"));
  EXPECT_TRUE(glob_match("layers.?.w", "layers.3.w"));
  EXPECT_FALSE(glob_match("layers.?.w", "layers.10.w"));
  EXPECT_TRUE(glob_match("*", ""));
  std::vector<ShardRule> rules = {{"*.a", 0}, {"*", 1}};
  EXPECT_EQ(find_shard_rule(rules, "x.a")->dim, 0);
  EXPECT_EQ(find_shard_rule(rules, "x.b")->dim, 1);
  EXPECT_EQ(find_shard_rule({}, "x.b"), nullptr);
}

TEST(Shard, Layouts) {
  auto l = *shard_layout(DType::F32, Shape{8, 6}, 0, 1, 2);
  EXPECT_EQ(l.shape, (Shape{4, 6}));
  EXPECT_EQ(l.outer, 1u);  // one contiguous range
  EXPECT_EQ(l.run, 96u);
  EXPECT_EQ(l.first, 96u);
  l = *shard_layout(DType::BF16, Shape{6, 8}, 1, 1, 4);
  EXPECT_EQ(l.shape, (Shape{6, 2}));
  EXPECT_EQ(l.outer, 6u);  // strided rows
  EXPECT_EQ(l.run, 4u);
  EXPECT_EQ(l.stride, 16u);
  EXPECT_EQ(l.first, 4u);
  l = *shard_layout(DType::F32, Shape{6, 8}, 1, 0, 1);  // world 1: coalesced into one run
  EXPECT_EQ(l.outer, 1u);
  EXPECT_EQ(l.run, 192u);
  auto bad = shard_layout(DType::F32, Shape{5, 4}, 0, 0, 2);
  EXPECT_NE(bad.status().message().find("does not divide into 2 shards"), std::string::npos);
  EXPECT_NE(shard_layout(DType::F32, Shape{4}, 1, 0, 2).status().message().find("out of range"), std::string::npos);
  EXPECT_NE(shard_layout(DType::F32, Shape{4}, 0, 3, 2).status().message().find("outside [0, 2)"), std::string::npos);
  EXPECT_NE(shard_layout(DType::F32, Shape{4}, 0, 0, 0).status().message().find("below 1"), std::string::npos);
}

TEST(Shard, SliceLayoutsAnyDim) {
  // [4, 6] F32: columns [2, 5) are 4 runs of 12 bytes, 24 apart, from byte 8.
  auto l = *slice_layout(DType::F32, Shape{4, 6}, 1, 2, 3);
  EXPECT_EQ(l.shape, (Shape{4, 3}));
  EXPECT_EQ(l.outer, 4u);
  EXPECT_EQ(l.run, 12u);
  EXPECT_EQ(l.stride, 24u);
  EXPECT_EQ(l.first, 8u);
  // Rows [1, 3): one run.
  l = *slice_layout(DType::F32, Shape{4, 6}, -2, 1, 2);
  EXPECT_EQ(l.outer, 1u);
  EXPECT_EQ(l.run, 48u);
  EXPECT_EQ(l.first, 24u);
  // The shard layout is the slice [r*S, (r+1)*S).
  auto s = *shard_layout(DType::F32, Shape{4, 6}, 1, 1, 2);
  auto t = *slice_layout(DType::F32, Shape{4, 6}, 1, 3, 3);
  EXPECT_EQ(s.first, t.first);
  EXPECT_EQ(s.run, t.run);
  EXPECT_EQ(s.shape, t.shape);
  auto bad = slice_layout(DType::F32, Shape{4, 6}, 1, 4, 3);
  EXPECT_NE(bad.status().message().find("slice [4, 7) is outside dim 1 of shape [4, 6]"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(slice_layout(DType::F32, Shape{4}, 2, 0, 1).status().message().find("out of range"), std::string::npos);
}

TEST(Shard, SliceLayoutsOfSubByteDtypesNeedWholeBytesPerStep) {
  // F4 [4, 8]: a row is 8 values of 4 bits, 4 bytes; rows [1, 3) are bytes [4, 12).
  auto l = *slice_layout(DType::F4, Shape{4, 8}, 0, 1, 2);
  EXPECT_EQ(l.shape, (Shape{2, 8}));
  EXPECT_EQ(l.outer, 1u);
  EXPECT_EQ(l.run, 8u);
  EXPECT_EQ(l.first, 4u);
  EXPECT_EQ(l.nbytes, 8u);
  // F6 [4, 4]: a row is 24 bits, 3 bytes.
  EXPECT_EQ(slice_layout(DType::F6_E2M3, Shape{4, 4}, 0, 2, 2)->first, 6u);
  // A step that is not whole bytes: F4 rows of an odd width, F4 columns.
  for (auto [shape, dim] : {std::pair{Shape{4, 3}, 0}, std::pair{Shape{4, 8}, 1}}) {
    auto bad = slice_layout(DType::F4, shape, dim, 0, 1);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("not whole bytes"), std::string::npos) << bad.status().message();
  }
  // Sharding sub-byte tensors stays refused (a rank's part is not a row range the caller chose).
  EXPECT_NE(shard_layout(DType::F4, Shape{4, 8}, 0, 0, 2).status().message().find("narrower than a byte"),
            std::string::npos);
}

}  // namespace
}  // namespace wl

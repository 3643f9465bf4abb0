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

ParamRef ref_of(Tensor& t) { return {t.dtype(), t.shape(), t.mutable_bytes()}; }

TEST(WeightLoaders, DefaultChecksShapesAndReshapesScalars) {
  Tensor src = make_f32({2, 3}, 1);
  Tensor dst = *Tensor::empty(DType::F32, {2, 3});
  ASSERT_TRUE(default_weight_loader(ref_of(dst), src.view()).ok());
  EXPECT_EQ(std::memcmp(dst.bytes().data(), src.bytes().data(), src.nbytes()), 0);
  Tensor wrong = *Tensor::empty(DType::F32, {3, 2});
  auto s = default_weight_loader(ref_of(wrong), src.view());
  EXPECT_NE(s.message().find("attempted to load weight [2, 3] into parameter [3, 2]"), std::string::npos) << s.message();
  Tensor wrong_dtype = *Tensor::empty(DType::F16, {2, 3});
  EXPECT_NE(default_weight_loader(ref_of(wrong_dtype), src.view()).message().find("F16"), std::string::npos);
  Tensor scalar_src = make_f32({1}, 7), scalar_dst = *Tensor::empty(DType::F32, {});
  ASSERT_TRUE(default_weight_loader(ref_of(scalar_dst), scalar_src.view()).ok());
  EXPECT_EQ(*reinterpret_cast<const float*>(scalar_dst.bytes().data()), 7000.0f);
}

TEST(WeightLoaders, RowParallelShardedAndComposed) {
  Tensor full = make_f32({4, 6}, 0);  // element (r, c) = r*6 + c
  Tensor rows = *Tensor::empty(DType::F32, {2, 6});
  ASSERT_TRUE(row_parallel_weight_loader(1)(ref_of(rows), full.view()).ok());
  EXPECT_EQ(reinterpret_cast<const float*>(rows.bytes().data())[0], 12.0f);
  Tensor bias = make_f32({6}, 1), bias_dst = *Tensor::empty(DType::F32, {6});
  ASSERT_TRUE(row_parallel_weight_loader(1)(ref_of(bias_dst), bias.view()).ok());  // 1-D: whole
  Tensor cols = *Tensor::empty(DType::F32, {4, 3});
  ASSERT_TRUE(sharded_weight_loader(1, 1)(ref_of(cols), full.view()).ok());
  const float* c = reinterpret_cast<const float*>(cols.bytes().data());
  EXPECT_EQ(c[0], 3.0f);
  EXPECT_EQ(c[3], 9.0f);
  auto doubled = composed_weight_loader(sharded_weight_loader(1, 0), [](const ParamRef& p) {
    float* f = reinterpret_cast<float*>(p.bytes.data());
    for (size_t i = 0; i < p.bytes.size() / 4; ++i) f[i] *= 2;
    return Status();
  });
  ASSERT_TRUE(doubled(ref_of(cols), full.view()).ok());
  EXPECT_EQ(reinterpret_cast<const float*>(cols.bytes().data())[4], 14.0f);  // (1,1) = 7, doubled
  auto s = sharded_weight_loader(0, 3)(ref_of(rows), full.view());
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("outside dim 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace wl

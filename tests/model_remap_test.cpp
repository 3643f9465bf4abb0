// maybe_remap_kv_scale_name / maybe_remap_moe_expert_param_name, branch by branch.
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "weightlift/remap.h"

namespace wl {
namespace {

struct Warnings {
  std::vector<std::string> seen;
  WarnFn fn() {
    return [this](const std::string& w) { seen.push_back(w); };
  }
};

std::optional<std::string> remap(std::string_view name, const ParamNames& params, Warnings* w = nullptr) {
  static Warnings sink;
  return maybe_remap_kv_scale_name(name, params, (w ? w : &sink)->fn());
}

TEST(KvScaleRemap, NameAlreadyAParameterIsKept) {
  ParamNames p = {"model.layers.0.self_attn.attn.k_scale"};
  EXPECT_EQ(remap("model.layers.0.self_attn.attn.k_scale", p), "model.layers.0.self_attn.attn.k_scale");
}

TEST(KvScaleRemap, DeprecatedKvScaleBecomesKScale) {
  ParamNames p = {"model.layers.0.self_attn.attn.k_scale"};
  Warnings w;
  EXPECT_EQ(remap("model.layers.0.self_attn.kv_scale", p, &w), "model.layers.0.self_attn.attn.k_scale");
  ASSERT_EQ(w.seen.size(), 1u);
  EXPECT_NE(w.seen[0].find("DEPRECATED"), std::string::npos);
}

TEST(KvScaleRemap, DeprecatedKvScaleMissingTargetIsDroppedWithWarning) {
  Warnings w;
  EXPECT_EQ(remap("model.layers.0.self_attn.kv_scale", {}, &w), std::nullopt);
  ASSERT_EQ(w.seen.size(), 2u);
  EXPECT_NE(w.seen[1].find("model.layers.0.self_attn.attn.k_scale"), std::string::npos);
  EXPECT_NE(w.seen[1].find("kv_scale is not loaded"), std::string::npos);
}

TEST(KvScaleRemap, DeprecatedKvScaleReplacesEveryOccurrence) {
  // Python's str.replace replaces all occurrences.
  ParamNames p = {"a.attn.k_scale.b.attn.k_scale"};
  EXPECT_EQ(remap("a.kv_scale.b.kv_scale", p), "a.attn.k_scale.b.attn.k_scale");
}

TEST(KvScaleRemap, ModelOptProjScales) {
  ParamNames p = {"l.0.self_attn.attn.k_scale", "l.0.self_attn.attn.v_scale"};
  EXPECT_EQ(remap("l.0.self_attn.k_proj.k_scale", p), "l.0.self_attn.attn.k_scale");
  EXPECT_EQ(remap("l.0.self_attn.v_proj.v_scale", p), "l.0.self_attn.attn.v_scale");
  // The scale letter, not the projection letter, names the target.
  EXPECT_EQ(remap("l.0.self_attn.k_proj.v_scale", p), "l.0.self_attn.attn.v_scale");
}

TEST(KvScaleRemap, ModelOptUsesMlaAttentionWhenTheModelHasIt) {
  ParamNames p = {"l.0.self_attn.mla_attn.mla_attn.k_scale", "l.0.self_attn.mla_attn.kv_b_proj.weight"};
  EXPECT_EQ(remap("l.0.self_attn.k_proj.k_scale", p), "l.0.self_attn.mla_attn.mla_attn.k_scale");
  // Only the ModelOpt pattern takes the MLA name; the default stays ".attn".
  Warnings w;
  EXPECT_EQ(remap("l.0.self_attn.k_scale", p, &w), std::nullopt);
  ASSERT_EQ(w.seen.size(), 1u);
  EXPECT_NE(w.seen[0].find("l.0.self_attn.attn.k_scale"), std::string::npos);
}

TEST(KvScaleRemap, QkvProjAndQkqkvProj) {
  ParamNames p = {"l.1.self_attn.attn.k_scale", "l.1.self_attn.attn.v_scale"};
  EXPECT_EQ(remap("l.1.self_attn.qkv_proj.k_scale", p), "l.1.self_attn.attn.k_scale");
  EXPECT_EQ(remap("l.1.self_attn.qkqkv_proj.v_scale", p), "l.1.self_attn.attn.v_scale");
  // q through qkv_proj is not a qkv_proj pattern: the default appends ".attn".
  ParamNames q = {"l.1.self_attn.qkv_proj.attn.q_scale"};
  EXPECT_EQ(remap("l.1.self_attn.qkv_proj.q_scale", q), "l.1.self_attn.qkv_proj.attn.q_scale");
}

TEST(KvScaleRemap, NemotronHMixer) {
  ParamNames p = {"backbone.layers.3.mixer.attn.k_scale", "backbone.layers.3.mixer.attn.v_scale"};
  EXPECT_EQ(remap("backbone.layers.3.mixer.k_proj.k_scale", p), "backbone.layers.3.mixer.attn.k_scale");
  EXPECT_EQ(remap("backbone.layers.3.mixer.v_proj.v_scale", p), "backbone.layers.3.mixer.attn.v_scale");
}

TEST(KvScaleRemap, Hyv3QScaleAndCacheScales) {
  ParamNames p = {"m.self_attn.attn.q_scale", "m.self_attn.attn.k_scale", "m.self_attn.attn.v_scale"};
  EXPECT_EQ(remap("m.self_attn.q.scale", p), "m.self_attn.attn.q_scale");
  EXPECT_EQ(remap("m.self_attn.k_cache.scale", p), "m.self_attn.attn.k_scale");
  EXPECT_EQ(remap("m.self_attn.v_cache.scale", p), "m.self_attn.attn.v_scale");
  // The suffix alone, outside self_attn, matches no pattern: unchanged.
  EXPECT_EQ(remap("m.mlp.q.scale", p), "m.mlp.q.scale");
  EXPECT_EQ(remap("m.mlp.k_cache.scale", p), "m.mlp.k_cache.scale");
}

TEST(KvScaleRemap, DefaultScalesAndZeroPoints) {
  ParamNames p = {"m.l.attn.q_scale",      "m.l.attn.k_scale",      "m.l.attn.v_scale",
                  "m.l.attn.k_zero_point", "m.l.attn.v_zero_point", "m.l.attn.q_zero_point"};
  for (const char* s : {"q_scale", "k_scale", "v_scale", "k_zero_point", "v_zero_point", "q_zero_point"})
    EXPECT_EQ(remap(std::string("m.l.") + s, p), std::string("m.l.attn.") + s) << s;
}

TEST(KvScaleRemap, MatchWithoutParameterIsDroppedWithWarning) {
  Warnings w;
  EXPECT_EQ(remap("m.l.self_attn.k_proj.k_scale", {"x"}, &w), std::nullopt);
  ASSERT_EQ(w.seen.size(), 1u);
  EXPECT_EQ(w.seen[0],
            "found k_scale in the checkpoint (e.g. m.l.self_attn.k_proj.k_scale) but the model has no parameter "
            "m.l.self_attn.attn.k_scale; k_scale is not loaded");
  Warnings z;
  EXPECT_EQ(remap("m.l.v_zero_point", {}, &z), std::nullopt);
  ASSERT_EQ(z.seen.size(), 1u);
  EXPECT_NE(z.seen[0].find("found v_zero_point"), std::string::npos);
}

TEST(KvScaleRemap, OtherNamesAreUnchanged) {
  EXPECT_EQ(remap("model.layers.0.mlp.down_proj.weight", {}), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(remap("model.layers.0.self_attn.k_proj.weight_scale", {}), "model.layers.0.self_attn.k_proj.weight_scale");
  EXPECT_EQ(remap("x.o_scale", {}), "x.o_scale");
  EXPECT_EQ(remap("", {}), "");
}

TEST(KvScaleRemap, DefaultWarningSinkDoesNotCrash) {
  EXPECT_EQ(maybe_remap_kv_scale_name("a.kv_scale", ParamNames{}), std::nullopt);
  EXPECT_EQ(maybe_remap_kv_scale_name("a.kv_scale", ParamNames{}), std::nullopt);  // printed once
}

TEST(MoeExpertRemap, InsertsRoutedExpertsWhenTheModelHasIt) {
  ParamNames p = {"layers.0.mlp.experts.routed_experts.w13_weight",
                  "layers.0.feed_forward.experts.routed_experts.w2_input_scale"};
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.0.mlp.experts.w13_weight", p),
            "layers.0.mlp.experts.routed_experts.w13_weight");
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.0.feed_forward.experts.w2_input_scale", p),
            "layers.0.feed_forward.experts.routed_experts.w2_input_scale");
}

TEST(MoeExpertRemap, KeepsTheNameOtherwise) {
  ParamNames p = {"layers.0.mlp.experts.routed_experts.w13_weight"};
  // No ".experts." at all.
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.0.mlp.w13_weight", p), "layers.0.mlp.w13_weight");
  // Already routed.
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.0.mlp.experts.routed_experts.w13_weight", p),
            "layers.0.mlp.experts.routed_experts.w13_weight");
  // Not an expert parameter (per-expert checkpoint names).
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.0.mlp.experts.0.gate_proj.weight", p),
            "layers.0.mlp.experts.0.gate_proj.weight");
  // An expert parameter the model does not have under routed_experts.
  EXPECT_EQ(maybe_remap_moe_expert_param_name("layers.1.mlp.experts.w2_weight", p), "layers.1.mlp.experts.w2_weight");
}

TEST(MoeExpertRemap, SuffixMatchesAnywhereOrAtTheEnd) {
  // ".w13_qzeros" inside the name counts; so does a bare suffix "...xw2_bias".
  ParamNames p = {"a.experts.routed_experts.w13_qzeros.extra", "a.experts.routed_experts.prefix_w2_bias"};
  EXPECT_EQ(maybe_remap_moe_expert_param_name("a.experts.w13_qzeros.extra", p),
            "a.experts.routed_experts.w13_qzeros.extra");
  EXPECT_EQ(maybe_remap_moe_expert_param_name("a.experts.prefix_w2_bias", p),
            "a.experts.routed_experts.prefix_w2_bias");
}

TEST(MoeExpertRemap, OnlyTheFirstExpertsIsRewritten) {
  ParamNames p = {"a.experts.routed_experts.b.experts.w13_g_idx"};
  EXPECT_EQ(maybe_remap_moe_expert_param_name("a.experts.b.experts.w13_g_idx", p),
            "a.experts.routed_experts.b.experts.w13_g_idx");
}

TEST(MoeExpertRemap, StreamVersionRemapsLazilyInOrder) {
  ParamNames p = {"l.experts.routed_experts.w13_weight", "l.experts.routed_experts.w2_weight_scale"};
  std::vector<std::pair<std::string, int>> weights = {
      {"l.experts.w13_weight", 1}, {"l.norm.weight", 2}, {"l.experts.w2_weight_scale", 3}};
  std::vector<std::pair<std::string, int>> out;
  remap_moe_expert_weights(weights, p, [&](std::string name, int w) { out.emplace_back(std::move(name), w); });
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], (std::pair<std::string, int>{"l.experts.routed_experts.w13_weight", 1}));
  EXPECT_EQ(out[1], (std::pair<std::string, int>{"l.norm.weight", 2}));
  EXPECT_EQ(out[2], (std::pair<std::string, int>{"l.experts.routed_experts.w2_weight_scale", 3}));
}

}  // namespace
}  // namespace wl

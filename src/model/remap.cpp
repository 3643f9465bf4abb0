// Checkpoint-name remapping (see weightlift/remap.h). Patterns use RE2.
#include "weightlift/remap.h"

#include <array>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <re2/re2.h>

#include "weightlift/text.h"

namespace wl {
namespace {

void warn_once_stderr(const std::string& text) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(text).second) return;
  std::fprintf(stderr, "weightlift: warning: %s\n", text.c_str());
}

// Warnings name checkpoint tensors: inert (text.h).
void emit(const WarnFn& warn, const std::string& text) {
  if (warn)
    warn(inert(text));
  else
    warn_once_stderr(inert(text));
}

// Python's str.replace(old, new): every non-overlapping occurrence, left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

struct ScalePattern {
  std::unique_ptr<RE2> re;
  std::string rewrite;  // RE2 rewrite (\1, \2)
  bool uses_attn_str;   // the ModelOpt pattern takes the MLA attention name
};

const std::vector<ScalePattern>& scale_patterns() {
  static const std::vector<ScalePattern> patterns = [] {
    std::vector<ScalePattern> p;
    auto add = [&](const char* re, const char* rewrite, bool attn) {
      p.push_back({std::make_unique<RE2>(re), rewrite, attn});
    };
    add(R"(\.self_attn\.([kv])_proj\.([kv])_scale$)", "", true);  // rewrite built per call
    add(R"(\.self_attn\.qkv_proj\.([kv])_scale$)", R"(.self_attn.attn.\1_scale)", false);
    add(R"(\.self_attn\.qkqkv_proj\.([kv])_scale$)", R"(.self_attn.attn.\1_scale)", false);
    add(R"(\.mixer\.[kv]_proj\.([kv])_scale$)", R"(.mixer.attn.\1_scale)", false);
    add(R"(\.self_attn\.q\.scale$)", R"(.self_attn.attn.q_scale)", false);
    add(R"(\.self_attn\.([kv])_cache\.scale$)", R"(.self_attn.attn.\1_scale)", false);
    add(R"(\.([qkv])_scale$)", R"(.attn.\1_scale)", false);
    add(R"(\.([qkv])_zero_point$)", R"(.attn.\1_zero_point)", false);
    return p;
  }();
  return patterns;
}

constexpr std::array<std::string_view, 9> kScaleSuffixes = {".k_scale",      ".v_scale",       ".q_scale",
                                                            ".k_zero_point", ".v_zero_point",  ".q_zero_point",
                                                            ".q.scale",      ".k_cache.scale", ".v_cache.scale"};

constexpr std::array<std::string_view, 18> kExpertSuffixes = {
    "w13_weight",  "w2_weight",  "w13_weight_scale", "w2_weight_scale", "w13_input_scale",  "w2_input_scale",
    "w13_bias",    "w2_bias",    "w13_scale",        "w2_scale",        "w13_g_idx",        "w2_g_idx",
    "w13_qweight", "w2_qweight", "w13_qzeros",       "w2_qzeros",       "w13_weight_shape", "w2_weight_shape"};

}  // namespace

ParamLookup ParamLookup::of(const ParamNames& names) {
  return {[&names](const std::string& n) { return names.count(n) > 0; },
          [&names](std::string_view text) {
            for (const auto& k : names)
              if (k.find(text) != std::string::npos) return true;
            return false;
          }};
}

std::optional<std::string> maybe_remap_kv_scale_name(std::string_view name, const ParamNames& params,
                                                     const WarnFn& warn) {
  return maybe_remap_kv_scale_name(name, ParamLookup::of(params), warn);
}

std::string maybe_remap_moe_expert_param_name(std::string_view name, const ParamNames& params) {
  return maybe_remap_moe_expert_param_name(name, ParamLookup::of(params));
}

std::optional<std::string> maybe_remap_kv_scale_name(std::string_view name, const ParamLookup& params,
                                                     const WarnFn& warn) {
  std::string n(name);
  if (params.contains(n)) return n;

  if (name.ends_with(".kv_scale")) {
    emit(warn,
         "DEPRECATED: found kv_scale in the checkpoint; it is remapped to k_scale (and k_scale is "
         "used for v_scale). Store separate k_scale and v_scale tensors instead.");
    std::string remapped = replace_all(name, ".kv_scale", ".attn.k_scale");
    if (!params.contains(remapped)) {
      emit(warn, "found kv_scale in the checkpoint (e.g. " + n + ") but the model has no parameter " + remapped +
                     "; kv_scale is not loaded");
      return std::nullopt;
    }
    return remapped;
  }

  bool is_scale = false;
  for (auto suffix : kScaleSuffixes)
    if (name.ends_with(suffix)) is_scale = true;
  if (!is_scale) return n;

  const bool mla = params.any_contains("mla_attn");
  const std::string modelopt_rewrite =
      std::string(".self_attn.") + (mla ? "mla_attn.mla_attn" : "attn") + R"(.\2_scale)";

  for (const auto& p : scale_patterns()) {
    re2::StringPiece input(n.data(), n.size());
    if (!RE2::PartialMatch(input, *p.re)) continue;
    std::string remapped = n;
    RE2::Replace(&remapped, *p.re, p.uses_attn_str ? modelopt_rewrite : p.rewrite);
    if (!params.contains(remapped)) {
      std::string scale_type = n.substr(n.rfind('.') + 1);
      emit(warn, "found " + scale_type + " in the checkpoint (e.g. " + n + ") but the model has no parameter " +
                     remapped + "; " + scale_type + " is not loaded");
      return std::nullopt;
    }
    return remapped;
  }
  return n;
}

std::string maybe_remap_moe_expert_param_name(std::string_view name, const ParamLookup& params) {
  std::string n(name);
  if (name.find(".experts.") == std::string_view::npos) return n;
  if (name.find(".experts.routed_experts.") != std::string_view::npos) return n;
  bool expert = false;
  for (auto suffix : kExpertSuffixes) {
    std::string dotted = "." + std::string(suffix);
    if (name.find(dotted) != std::string_view::npos || name.ends_with(suffix)) {
      expert = true;
      break;
    }
  }
  if (!expert) return n;
  size_t at = name.find(".experts.");
  std::string candidate = n.substr(0, at) + ".experts.routed_experts." + n.substr(at + 9);
  if (params.contains(candidate)) return candidate;
  return n;
}

}  // namespace wl

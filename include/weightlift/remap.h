// weightlift/remap.h: checkpoint-name remapping of vLLM weight_utils
// (maybe_remap_kv_scale_name, maybe_remap_moe_expert_param_name,
// remap_moe_expert_weights). Pure functions of the name and the model's
// parameter names; thread-safe (the default warning sink locks).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>

namespace wl {

// The model's parameter names (vLLM's params_dict keys).
using ParamNames = std::unordered_set<std::string>;

// The same names seen through two questions (for callers whose names live
// elsewhere, e.g. a Python dict, so that nothing is copied per call).
struct ParamLookup {
  std::function<bool(const std::string& name)> contains;
  std::function<bool(std::string_view text)> any_contains;  // some name contains `text`
  static ParamLookup of(const ParamNames& names);
};

// Receives a warning text. The default (empty function) prints
// "weightlift: warning: <text>" to stderr once per distinct text, as vLLM's
// logger.warning_once does.
using WarnFn = std::function<void(const std::string&)>;

// Remaps a k/v/q scale or zero-point name to the model's name for it:
//  - a name that is already a parameter is returned unchanged;
//  - the deprecated ".kv_scale" becomes ".attn.k_scale" (every occurrence;
//    a deprecation warning is given); nullopt + warning when that is no parameter;
//  - names ending in .k_scale .v_scale .q_scale .k_zero_point .v_zero_point
//    .q_zero_point .q.scale .k_cache.scale .v_cache.scale go through the
//    patterns, first match wins: ModelOpt .self_attn.{k,v}_proj.{k,v}_scale
//    (-> .self_attn.<attn>.{k,v}_scale, <attn> = "mla_attn.mla_attn" when any
//    parameter name contains "mla_attn", else "attn"), .self_attn.qkv_proj.X_scale,
//    .self_attn.qkqkv_proj.X_scale, NemotronH .mixer.{k,v}_proj.X_scale, HYV3
//    .self_attn.q.scale and .self_attn.{k,v}_cache.scale, then the default
//    .X_scale -> .attn.X_scale and .X_zero_point -> .attn.X_zero_point;
//    a match whose result is no parameter gives nullopt and a warning;
//  - anything else is returned unchanged.
std::optional<std::string> maybe_remap_kv_scale_name(std::string_view name, const ParamNames& params,
                                                     const WarnFn& warn = {});
std::optional<std::string> maybe_remap_kv_scale_name(std::string_view name, const ParamLookup& params,
                                                     const WarnFn& warn = {});

// Inserts "routed_experts." after the first ".experts." of an expert
// parameter name (w13_/w2_ weight, weight_scale, input_scale, bias, scale,
// g_idx, qweight, qzeros, weight_shape) when the model has that name;
// otherwise returns the name unchanged.
std::string maybe_remap_moe_expert_param_name(std::string_view name, const ParamNames& params);
std::string maybe_remap_moe_expert_param_name(std::string_view name, const ParamLookup& params);

// The stream version: calls fn(remapped_name, weight) for each (name, weight)
// of `weights` in order, lazily (nothing is buffered). Any range of pairs
// whose first member converts to std::string_view works.
template <class Range, class Fn>
void remap_moe_expert_weights(Range&& weights, const ParamNames& params, Fn&& fn) {
  for (auto&& [name, weight] : weights) fn(maybe_remap_moe_expert_param_name(name, params), weight);
}

}  // namespace wl

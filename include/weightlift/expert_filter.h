// weightlift/expert_filter.h: expert-parallel weight filtering, as the
// reference's should_skip_weight does it. Expert weights of other ranks are
// dropped from the load plan before any of their bytes are read.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string_view>

#include "weightlift/status.h"

namespace wl {

// The expert id in a name such as "model.layers.0.mlp.experts.42.up_proj.weight"
// (".experts.<digits>."). Fused names without an id, "shared_experts", and
// ids too large for int64 give nullopt.
std::optional<int64_t> parse_expert_id(std::string_view name);

enum class ExpertPlacement { kLinear, kRoundRobin };
// "linear" or "round_robin"; anything else is kInvalidArgument
// "Unknown expert placement strategy: <text>".
Result<ExpertPlacement> parse_expert_placement(std::string_view text);

// The experts rank `ep_rank` of `ep_size` holds: linear gives contiguous,
// balanced blocks (the first num%size ranks get one more), round-robin gives
// ids rank, rank+size, ... ep_size <= 1 gives nullopt (no filtering).
// Bad arguments (negative counts, rank out of range) are kInvalidArgument.
Result<std::optional<std::set<int64_t>>> compute_local_expert_ids(int64_t num_experts, int64_t ep_size, int64_t ep_rank,
                                                                  ExpertPlacement placement = ExpertPlacement::kLinear);

// True when `name` is an expert weight (".weight" or ".weight_packed" suffix;
// scales and other metadata are never skipped) whose id is not local.
// `local` == nullopt never skips.
bool should_skip_weight(std::string_view name, const std::optional<std::set<int64_t>>& local);

// "0-3,7,9" -> {0,1,2,3,7,9}. Empty text, bad numbers, reversed ranges, or
// a range over a million ids are kInvalidArgument.
Result<std::set<int64_t>> parse_expert_id_list(std::string_view text);

}  // namespace wl

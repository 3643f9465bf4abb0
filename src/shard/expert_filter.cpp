#include "weightlift/expert_filter.h"

#include <charconv>

#include <fmt/format.h>

namespace wl {

std::optional<int64_t> parse_expert_id(std::string_view name) {
  constexpr std::string_view kKey = ".experts.";
  size_t from = 0;
  while (true) {
    size_t pos = name.find(kKey, from);
    if (pos == std::string_view::npos) return std::nullopt;
    size_t b = pos + kKey.size(), e = b;
    while (e < name.size() && name[e] >= '0' && name[e] <= '9') ++e;
    if (e > b && e < name.size() && name[e] == '.') {
      int64_t v = 0;
      auto [p, ec] = std::from_chars(name.data() + b, name.data() + e, v);
      if (ec != std::errc() || p != name.data() + e) return std::nullopt;
      return v;
    }
    from = pos + 1;
  }
}

Result<ExpertPlacement> parse_expert_placement(std::string_view text) {
  if (text == "linear") return ExpertPlacement::kLinear;
  if (text == "round_robin") return ExpertPlacement::kRoundRobin;
  return Status::InvalidArgument("Unknown expert placement strategy: " + std::string(text));
}

Result<std::optional<std::set<int64_t>>> compute_local_expert_ids(int64_t num_experts, int64_t ep_size, int64_t ep_rank,
                                                                  ExpertPlacement placement) {
  if (num_experts < 0) return Status::InvalidArgument(fmt::format("number of experts {} is negative", num_experts));
  if (ep_size <= 1) return std::optional<std::set<int64_t>>();
  if (ep_rank < 0 || ep_rank >= ep_size)
    return Status::InvalidArgument(fmt::format("expert-parallel rank {} is outside [0, {})", ep_rank, ep_size));
  std::set<int64_t> ids;
  if (placement == ExpertPlacement::kLinear) {
    int64_t base = num_experts / ep_size, rem = num_experts % ep_size;
    int64_t start = ep_rank * base + std::min(ep_rank, rem);
    int64_t count = base + (ep_rank < rem ? 1 : 0);
    for (int64_t i = 0; i < count; ++i) ids.insert(start + i);
  } else {
    for (int64_t i = ep_rank; i < num_experts; i += ep_size) ids.insert(i);
  }
  return std::optional<std::set<int64_t>>(std::move(ids));
}

bool should_skip_weight(std::string_view name, const std::optional<std::set<int64_t>>& local) {
  if (!local) return false;
  auto id = parse_expert_id(name);
  if (!id) return false;
  if (!name.ends_with(".weight") && !name.ends_with(".weight_packed")) return false;
  return local->count(*id) == 0;
}

Result<std::set<int64_t>> parse_expert_id_list(std::string_view text) {
  std::set<int64_t> out;
  if (text.empty()) return Status::InvalidArgument("empty expert id list");
  auto parse_num = [&](std::string_view s) -> Result<int64_t> {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v < 0)
      return Status::InvalidArgument(fmt::format("bad expert id '{}' in '{}'", s, text));
    return v;
  };
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      WL_ASSIGN_OR_RETURN(int64_t v, parse_num(item));
      out.insert(v);
    } else {
      WL_ASSIGN_OR_RETURN(int64_t a, parse_num(item.substr(0, dash)));
      WL_ASSIGN_OR_RETURN(int64_t b, parse_num(item.substr(dash + 1)));
      if (b < a) return Status::InvalidArgument(fmt::format("expert id range '{}' is reversed", item));
      if (b - a >= 1'000'000) return Status::InvalidArgument(fmt::format("expert id range '{}' is too large", item));
      for (int64_t i = a; i <= b; ++i) out.insert(i);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace wl

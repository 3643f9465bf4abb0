#include "weightlift/shard.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>

#include "util/checked.h"

namespace wl {

Result<ShardRule> parse_shard_rule(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    return Status::InvalidArgument(fmt::format("shard rule '{}' is not PATTERN:DIM", text));
  std::string_view d = text.substr(colon + 1);
  int dim = 0;
  auto [p, ec] = std::from_chars(d.data(), d.data() + d.size(), dim);
  if (ec != std::errc() || p != d.data() + d.size() || dim < -64 || dim > 64)
    return Status::InvalidArgument(fmt::format("shard rule '{}' has a bad dim '{}'", text, d));
  return ShardRule{std::string(text.substr(0, colon)), dim};
}

const ShardRule* find_shard_rule(std::span<const ShardRule> rules, std::string_view name) {
  for (auto& r : rules)
    if (glob_match(r.pattern, name)) return &r;
  return nullptr;
}

Result<ShardLayout> shard_layout(DType dtype, std::span<const int64_t> shape, int dim, int64_t rank, int64_t world) {
  const int nd = static_cast<int>(shape.size());
  if (world < 1) return Status::InvalidArgument(fmt::format("tensor-parallel size {} is below 1", world));
  if (rank < 0 || rank >= world)
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is outside [0, {})", rank, world));
  int d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return Status::InvalidArgument(
        fmt::format("shard dim {} is out of range for a {}-D tensor {}", dim, nd, shape_to_string(shape)));
  if (dtype_bits(dtype) % 8 != 0)
    return Status::InvalidArgument(fmt::format("cannot shard {} tensors (narrower than a byte)", dtype_name(dtype)));
  if (shape[d] % world != 0)
    return Status::InvalidArgument(
        fmt::format("dim {} of shape {} does not divide into {} shards", d, shape_to_string(shape), world));
  const int64_t part = shape[d] / world;
  return slice_layout(dtype, shape, d, rank * part, part);
}

Result<ShardLayout> slice_layout(DType dtype, std::span<const int64_t> shape, int dim, int64_t start, int64_t length) {
  const int nd = static_cast<int>(shape.size());
  int d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return Status::InvalidArgument(
        fmt::format("slice dim {} is out of range for a {}-D tensor {}", dim, nd, shape_to_string(shape)));
  if (start < 0 || length < 0 || start > shape[d] || length > shape[d] - start)
    return Status::InvalidArgument(
        fmt::format("slice [{}, {}) is outside dim {} of shape {}", start, start + length, d, shape_to_string(shape)));
  uint64_t numel = 0;
  if (!checked_numel(shape, &numel)) return Status::InvalidArgument("shape overflows");
  // One step along d: the elements of the later dims, in bits; whole bytes
  // for every dtype of a byte or more, and for F4 / F6 when they add up.
  uint64_t inner_bits = static_cast<uint64_t>(dtype_bits(dtype));
  for (int k = d + 1; k < nd; ++k) {
    const auto n = static_cast<uint64_t>(shape[k]);
    if (n && inner_bits > UINT64_MAX / n) return Status::InvalidArgument("shape overflows");
    inner_bits *= n;
  }
  if (inner_bits % 8 != 0)
    return Status::InvalidArgument(
        fmt::format("cannot slice {} tensor {} along dim {}: a step of it is {} bits, not whole bytes",
                    dtype_name(dtype), shape_to_string(shape), d, inner_bits));
  ShardLayout l;
  l.dim = d;
  l.shape.assign(shape.begin(), shape.end());
  const uint64_t part = static_cast<uint64_t>(length);
  l.shape[d] = length;
  const uint64_t inner = inner_bits / 8;
  uint64_t outer = 1;
  for (int k = 0; k < d; ++k) outer *= static_cast<uint64_t>(shape[k]);
  l.outer = outer;
  l.run = part * inner;
  l.stride = static_cast<uint64_t>(shape[d]) * inner;
  l.first = static_cast<uint64_t>(start) * inner;
  l.nbytes = l.outer * l.run;
  // Coalesce: when the slice is the whole dim, runs are adjacent.
  if (l.run == l.stride && l.outer > 1) {
    l.run *= l.outer;
    l.stride = l.run;
    l.outer = 1;
  }
  if (l.run == 0) l.outer = l.nbytes == 0 ? 0 : l.outer;
  return l;
}

}  // namespace wl

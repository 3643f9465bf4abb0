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

bool glob_match(std::string_view pat, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pat.size() && (pat[p] == '?' || pat[p] == s[i])) {
      ++p, ++i;
    } else if (p < pat.size() && pat[p] == '*') {
      star = p++, mark = i;
    } else if (star != std::string_view::npos) {
      p = star + 1, i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pat.size() && pat[p] == '*') ++p;
  return p == pat.size();
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
    return Status::InvalidArgument(fmt::format("shard dim {} is out of range for a {}-D tensor {}", dim, nd,
                                               shape_to_string(shape)));
  if (dtype_bits(dtype) % 8 != 0)
    return Status::InvalidArgument(fmt::format("cannot shard {} tensors (narrower than a byte)", dtype_name(dtype)));
  if (shape[d] % world != 0)
    return Status::InvalidArgument(fmt::format("dim {} of shape {} does not divide into {} shards", d,
                                               shape_to_string(shape), world));
  uint64_t numel = 0;
  if (!checked_numel(shape, &numel)) return Status::InvalidArgument("shape overflows");
  ShardLayout l;
  l.dim = d;
  l.shape.assign(shape.begin(), shape.end());
  const uint64_t part = static_cast<uint64_t>(shape[d] / world);
  l.shape[d] = static_cast<int64_t>(part);
  uint64_t inner = static_cast<uint64_t>(dtype_size(dtype));
  for (int k = d + 1; k < nd; ++k) inner *= static_cast<uint64_t>(shape[k]);
  uint64_t outer = 1;
  for (int k = 0; k < d; ++k) outer *= static_cast<uint64_t>(shape[k]);
  l.outer = outer;
  l.run = part * inner;
  l.stride = static_cast<uint64_t>(shape[d]) * inner;
  l.first = static_cast<uint64_t>(rank) * l.run;
  l.nbytes = l.outer * l.run;
  // Coalesce: when the shard is the whole dim (world 1), runs are adjacent.
  if (l.run == l.stride && l.outer > 1) {
    l.run *= l.outer;
    l.stride = l.run;
    l.outer = 1;
  }
  if (l.run == 0) l.outer = l.nbytes == 0 ? 0 : l.outer;
  return l;
}

Result<Tensor> narrow_copy(const TensorView& src, int dim, int64_t start, int64_t length) {
  const auto& shape = src.shape();
  const int nd = static_cast<int>(shape.size());
  int d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return Status::InvalidArgument(fmt::format("narrow dim {} is out of range for shape {}", dim, shape_to_string(shape)));
  if (start < 0 || length < 0 || start > shape[d] || length > shape[d] - start)
    return Status::OutOfRange(fmt::format("narrow [{}, {}+{}) is outside dim {} of shape {}", start, start, length, d,
                                          shape_to_string(shape)));
  if (dtype_bits(src.dtype()) % 8 != 0)
    return Status::InvalidArgument(fmt::format("cannot narrow {} tensors", dtype_name(src.dtype())));
  Shape out_shape = shape;
  out_shape[d] = length;
  WL_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(src.dtype(), out_shape));
  uint64_t inner = static_cast<uint64_t>(dtype_size(src.dtype()));
  for (int k = d + 1; k < nd; ++k) inner *= static_cast<uint64_t>(shape[k]);
  uint64_t outer = 1;
  for (int k = 0; k < d; ++k) outer *= static_cast<uint64_t>(shape[k]);
  const uint64_t run = static_cast<uint64_t>(length) * inner, stride = static_cast<uint64_t>(shape[d]) * inner;
  if (src.nbytes() != outer * stride)
    return Status::Internal(fmt::format("view holds {} bytes, its shape needs {}", src.nbytes(), outer * stride));
  std::byte* o = out.mutable_bytes().data();
  for (uint64_t i = 0; i < outer && run > 0; ++i)
    std::memcpy(o + i * run, src.data() + i * stride + static_cast<uint64_t>(start) * inner, run);
  return out;
}

Status default_weight_loader(const ParamRef& param, const TensorView& loaded) {
  if (param.dtype != loaded.dtype())
    return Status::InvalidArgument(fmt::format("attempted to load a {} weight into a {} parameter",
                                               dtype_name(loaded.dtype()), dtype_name(param.dtype)));
  uint64_t pn = 0;
  if (!checked_numel(param.shape, &pn)) return Status::InvalidArgument("parameter shape overflows");
  const bool scalars = pn == 1 && loaded.numel() == 1;
  if (!scalars && param.shape != loaded.shape())
    return Status::InvalidArgument(fmt::format("attempted to load weight {} into parameter {}",
                                               shape_to_string(loaded.shape()), shape_to_string(param.shape)));
  if (param.bytes.size() != loaded.nbytes())
    return Status::InvalidArgument(fmt::format("parameter buffer holds {} bytes, the weight has {}", param.bytes.size(),
                                               loaded.nbytes()));
  if (loaded.nbytes()) std::memcpy(param.bytes.data(), loaded.data(), loaded.nbytes());
  return Status();
}

namespace {
Status load_narrowed(const ParamRef& param, const TensorView& loaded, int axis, int64_t rank) {
  const int nd = static_cast<int>(param.shape.size());
  int d = axis < 0 ? axis + nd : axis;
  if (d < 0 || d >= nd || static_cast<int>(loaded.shape().size()) != nd)
    return Status::InvalidArgument(fmt::format("cannot shard weight {} along axis {} into parameter {}",
                                               shape_to_string(loaded.shape()), axis, shape_to_string(param.shape)));
  const int64_t size = param.shape[d];
  if (rank < 0) return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is negative", rank));
  WL_ASSIGN_OR_RETURN(Tensor part, narrow_copy(loaded, d, rank * size, size));
  return default_weight_loader(param, part.view());
}
}  // namespace

WeightLoader row_parallel_weight_loader(int64_t tp_rank) {
  return [tp_rank](const ParamRef& param, const TensorView& loaded) -> Status {
    if (param.shape.size() == 1) return default_weight_loader(param, loaded);
    return load_narrowed(param, loaded, 0, tp_rank);
  };
}

WeightLoader sharded_weight_loader(int axis, int64_t tp_rank) {
  return [axis, tp_rank](const ParamRef& param, const TensorView& loaded) {
    return load_narrowed(param, loaded, axis, tp_rank);
  };
}

WeightLoader composed_weight_loader(WeightLoader loader, std::function<Status(const ParamRef&)> fn) {
  return [loader = std::move(loader), fn = std::move(fn)](const ParamRef& param, const TensorView& loaded) -> Status {
    WL_RETURN_IF_ERROR(loader(param, loaded));
    return fn(param);
  };
}

}  // namespace wl

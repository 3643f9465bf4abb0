// weightlift/shard.h: tensor-parallel selective reads: which bytes of a
// tensor one rank (or one slice) needs.
//
// A shard rule says which tensors split along which dim ("*.q_proj.weight:0").
// For a split tensor, rank r of W keeps the slice [r*S, (r+1)*S) of that dim,
// S = dim/W (the dim must divide evenly). Its bytes in the file are `outer`
// runs of `run` bytes, `stride` apart: one contiguous range for dim 0,
// coalesced strided rows for dim >= 1. The loader reads only those runs.
// Pure functions and values; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/dtype.h"
#include "weightlift/glob.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

struct ShardRule {
  std::string pattern;  // glob over the tensor name (glob.h: '*' any run, '?' one char, [seq])
  int dim = 0;          // negative counts from the end, as in Python
};

// "PATTERN:DIM" (the last ':' separates). Bad text is kInvalidArgument.
Result<ShardRule> parse_shard_rule(std::string_view text);
// The first rule whose pattern matches `name`, else nullptr.
const ShardRule* find_shard_rule(std::span<const ShardRule> rules, std::string_view name);

// Rows [begin, end) of a tensor's first dimension (LoadOptions::rows).
struct RowRange {
  int64_t begin = 0, end = 0;
};

// The bytes rank `rank` of `world` reads of a row-major tensor split along `dim`.
struct ShardLayout {
  int dim = 0;          // normalized, >= 0
  Shape shape;          // the shard's shape
  uint64_t nbytes = 0;  // outer * run
  uint64_t outer = 1;   // number of runs
  uint64_t run = 0;     // bytes per run
  uint64_t stride = 0;  // bytes between run starts in the full tensor
  uint64_t first = 0;   // offset of the first run inside the full tensor
};
// kInvalidArgument when dim is out of range, world < 1, rank outside [0, world),
// the dim does not divide by world, or the dtype is narrower than a byte.
// This is the one home of "rank r of W takes [r*S, (r+1)*S) of a dim": the
// loader's shard rules and safe_open's slices both come here.
Result<ShardLayout> shard_layout(DType dtype, std::span<const int64_t> shape, int dim, int64_t rank, int64_t world);
// The bytes of [start, start+length) along `dim` (any dim; the runs as above).
// kInvalidArgument for a dim out of range, a range outside the dim, or a
// step along `dim` that is not a whole number of bytes (a dtype narrower than
// a byte whose later dims do not make one up: F4 rows of an even width pass).
Result<ShardLayout> slice_layout(DType dtype, std::span<const int64_t> shape, int dim, int64_t start, int64_t length);

}  // namespace wl

#include "engine/rank_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace wl::engine {

namespace {

bool add_to(uint64_t& acc, uint64_t v) { return !__builtin_add_overflow(acc, v, &acc); }

// Each rank's share of the shared stream: water-filling over the bytes each
// already reads for itself, so that own + share is as level as possible.
std::vector<uint64_t> level_shares(const std::vector<uint64_t>& own, uint64_t shared) {
  const size_t w = own.size();
  std::vector<size_t> order(w);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return own[a] < own[b]; });
  // The largest j whose j smallest ranks can all be raised to one level
  // (the caller checked that shared + all own bytes fit in 64 bits).
  uint64_t sum = shared, sum_j = shared;
  size_t j = 0;
  for (size_t n = 1; n <= w; ++n) {
    sum += own[order[n - 1]];
    if (own[order[n - 1]] <= sum / n) j = n, sum_j = sum;
  }
  std::vector<uint64_t> share(w, 0);
  const auto level = static_cast<uint64_t>(sum_j / j);
  auto rem = static_cast<uint64_t>(sum_j % j);
  // Remainder bytes go to the lowest-numbered participants: the same answer on every rank.
  std::vector<size_t> part(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(j));
  std::sort(part.begin(), part.end());
  for (size_t k : part) {
    share[k] = level - own[k] + (rem > 0 ? 1 : 0);
    if (rem > 0) --rem;
  }
  return share;
}

}  // namespace

std::pair<uint64_t, uint64_t> RankPlan::slice(int k, uint64_t round) const {
  const uint64_t begin = cut[static_cast<size_t>(k)], end = cut[static_cast<size_t>(k) + 1];
  if (block == 0 || round >= (end - begin + block - 1) / block) return {end, end};
  const uint64_t a = begin + round * block;
  return {a, std::min(end, a + block)};
}

uint64_t RankPlan::round_block(uint64_t round) const {
  uint64_t n = 0;
  for (int k = 0; k < world; ++k) {
    auto [a, b] = slice(k, round);
    n = std::max(n, b - a);
  }
  return n;
}

Result<RankPlan> make_rank_plan(const RankPlanInput& in) {
  if (in.world < 1) return Status::InvalidArgument(fmt::format("world size {} is below 1", in.world));
  if (in.rank < 0 || in.rank >= in.world)
    return Status::InvalidArgument(fmt::format("rank {} is outside [0, {})", in.rank, in.world));
  if (in.block == 0) return Status::InvalidArgument("the exchange block is 0 bytes");
  const auto w = static_cast<size_t>(in.world);
  if (in.wants.size() != w)
    return Status::InvalidArgument(fmt::format("wants of {} ranks for a world of {}", in.wants.size(), w));
  for (size_t k = 0; k < w; ++k)
    if (in.wants[k].size() != in.tensors.size())
      return Status::InvalidArgument(
          fmt::format("rank {} wants {} tensors of {}", k, in.wants[k].size(), in.tensors.size()));
  if (in.tensors.size() > UINT32_MAX) return Status::InvalidArgument("too many tensors");

  RankPlan rp;
  rp.world = in.world;
  rp.rank = in.rank;
  rp.block = in.block;
  rp.own_bytes.assign(w, 0);
  const auto me = static_cast<size_t>(in.rank);
  uint64_t pos = 0;
  for (size_t ti = 0; ti < in.tensors.size(); ++ti) {
    const RankTensor& t = in.tensors[ti];
    size_t wanters = 0;
    for (size_t k = 0; k < w; ++k) wanters += in.wants[k][ti] != 0;
    if (wanters == 0) continue;
    const auto idx = static_cast<uint32_t>(ti);
    // Read by each rank that wants it: its own shard, or the whole tensor
    // when it cannot be cut by bytes, has none, or nobody else wants it.
    if (t.split || !t.file_offset || t.nbytes == 0 || wanters == 1) {
      const uint64_t each = t.split ? t.shard_nbytes : t.nbytes;
      for (size_t k = 0; k < w; ++k)
        if (in.wants[k][ti] && !add_to(rp.own_bytes[k], each)) return Status::InvalidArgument("sizes overflow");
      if (in.wants[me][ti]) rp.own.push_back(idx);
      continue;
    }
    if (*t.file_offset > UINT64_MAX - t.nbytes) return Status::InvalidArgument("a tensor's range overflows");
    rp.shared.push_back({pos, t.nbytes, t.file, *t.file_offset, idx, 0});
    if (!add_to(pos, t.nbytes)) return Status::InvalidArgument("sizes overflow");
    if (in.wants[me][ti]) rp.received.push_back(idx);
  }
  rp.shared_bytes = pos;

  uint64_t everything = rp.shared_bytes;
  for (uint64_t n : rp.own_bytes)
    if (!add_to(everything, n)) return Status::InvalidArgument("sizes overflow");
  std::vector<uint64_t> share = level_shares(rp.own_bytes, rp.shared_bytes);
  // Blocks no larger than the largest slice: small checkpoints get small buffers.
  const uint64_t largest = *std::max_element(share.begin(), share.end());
  if (largest > 0) rp.block = std::min(rp.block, largest);
  rp.cut.assign(w + 1, 0);
  rp.read_bytes.assign(w, 0);
  for (size_t k = 0; k < w; ++k) {
    rp.cut[k + 1] = rp.cut[k] + share[k];
    rp.read_bytes[k] = rp.own_bytes[k];
    if (!add_to(rp.read_bytes[k], share[k])) return Status::InvalidArgument("sizes overflow");
    rp.rounds = std::max(rp.rounds, (share[k] + rp.block - 1) / rp.block);
  }
  if (rp.cut[w] != rp.shared_bytes) return Status::Internal("the slices do not cover the shared stream");
  return rp;
}

size_t first_extent(const RankPlan& rp, uint64_t pos) {
  auto it = std::partition_point(rp.shared.begin(), rp.shared.end(),
                                 [&](const SharedExtent& x) { return x.pos + x.len <= pos; });
  return static_cast<size_t>(it - rp.shared.begin());
}

std::vector<ReadPiece> read_pieces(const RankPlan& rp, uint64_t a, uint64_t b) {
  std::vector<ReadPiece> out;
  for (size_t e = first_extent(rp, a); e < rp.shared.size() && rp.shared[e].pos < b; ++e) {
    const SharedExtent& x = rp.shared[e];
    const uint64_t s = std::max(a, x.pos), t = std::min(b, x.pos + x.len);
    if (s >= t) continue;
    const uint64_t off = x.file_off + (s - x.pos);
    if (!out.empty() && out.back().file == x.file && out.back().file_off + out.back().len == off) {
      out.back().len += t - s;
      continue;
    }
    out.push_back({x.file, off, t - s, s - a, x.tensor});
  }
  return out;
}

}  // namespace wl::engine

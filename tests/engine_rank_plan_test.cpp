// The rank plan (src/engine/rank_plan.h): every wanted byte read from storage
// by exactly one rank, balanced by bytes, exchanged in equal blocks.
#include "engine/rank_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

namespace wl::engine {
namespace {

RankPlanInput replica(int world, int rank, std::vector<uint64_t> sizes, uint64_t block) {
  RankPlanInput in;
  in.world = world;
  in.rank = rank;
  in.block = block;
  uint64_t off = 0;
  for (uint64_t n : sizes) {
    in.tensors.push_back({0, off, n, false, 0});
    off += n;
  }
  in.wants.assign(static_cast<size_t>(world), std::vector<char>(sizes.size(), 1));
  return in;
}

// Who reads each byte of file 0 over all ranks' plans: (file offset -> count).
std::map<uint64_t, int> readers(const RankPlanInput& base) {
  std::map<uint64_t, int> count;
  for (int r = 0; r < base.world; ++r) {
    RankPlanInput in = base;
    in.rank = r;
    auto rp = make_rank_plan(in);
    EXPECT_TRUE(rp.ok()) << rp.status().to_string();
    auto [a, b] = std::pair(rp->cut[static_cast<size_t>(r)], rp->cut[static_cast<size_t>(r) + 1]);
    for (const ReadPiece& p : read_pieces(*rp, a, b))
      for (uint64_t i = 0; i < p.len; ++i) count[p.file_off + i]++;
    for (uint32_t t : rp->own) {
      const RankTensor& rt = in.tensors[t];
      // Own tensors here are split dim-0: rank r's shard is the r-th run.
      uint64_t first = rt.split ? *rt.file_offset + static_cast<uint64_t>(r) * rt.shard_nbytes : *rt.file_offset;
      uint64_t n = rt.split ? rt.shard_nbytes : rt.nbytes;
      for (uint64_t i = 0; i < n; ++i) count[first + i]++;
    }
  }
  return count;
}

TEST(RankPlan, ReplicaSplitsTheStreamByBytesNotTensors) {
  // One huge tensor and many small ones: a split by tensor count would be lopsided.
  std::vector<uint64_t> sizes = {1000, 10, 10, 10, 10, 10, 10, 10, 10, 7};
  for (int w : {1, 2, 3, 4, 7}) {
    RankPlanInput in = replica(w, 0, sizes, 64);
    auto rp = make_rank_plan(in);
    ASSERT_TRUE(rp.ok()) << rp.status().to_string();
    const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
    // A world of one reads everything itself; more ranks exchange everything.
    EXPECT_EQ(rp->shared_bytes, w == 1 ? 0 : total);
    EXPECT_EQ(rp->own.size(), w == 1 ? sizes.size() : 0);
    EXPECT_EQ(rp->received.size(), w == 1 ? 0 : sizes.size());
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t r : rp->read_bytes) lo = std::min(lo, r), hi = std::max(hi, r);
    EXPECT_LE(hi - lo, 1u) << "world " << w;
    EXPECT_EQ(rp->rounds, w == 1 ? 0 : (hi + 63) / 64);
    // Every byte read exactly once across ranks.
    auto count = readers(in);
    ASSERT_EQ(count.size(), total);
    for (auto& [off, n] : count) ASSERT_EQ(n, 1) << "byte " << off << " world " << w;
  }
}

TEST(RankPlan, SlicesAndRoundsCoverEachRanksShare) {
  RankPlanInput in = replica(3, 1, {100, 50, 61}, 16);
  auto rp = make_rank_plan(in);
  ASSERT_TRUE(rp.ok());
  for (int k = 0; k < 3; ++k) {
    uint64_t covered = 0, expect = rp->cut[static_cast<size_t>(k)];
    for (uint64_t i = 0; i < rp->rounds; ++i) {
      auto [a, b] = rp->slice(k, i);
      ASSERT_LE(b - a, 16u);
      if (a == b) continue;
      EXPECT_EQ(a, expect);  // consecutive rounds continue the slice
      expect = b;
      covered += b - a;
    }
    EXPECT_EQ(covered, rp->cut[static_cast<size_t>(k) + 1] - rp->cut[static_cast<size_t>(k)]);
  }
}

TEST(RankPlan, ShardsAreReadByTheirOwnersAndOnlyReplicatedTensorsAreExchanged) {
  RankPlanInput in;
  in.world = 4;
  in.block = 32;
  // A split tensor of 400 bytes (dim 0: 4 shards of 100), a 30-byte norm, another split of 80.
  in.tensors = {{0, 0, 400, true, 100}, {0, 400, 30, false, 0}, {0, 430, 80, true, 20}};
  in.wants.assign(4, std::vector<char>(3, 1));
  for (int r = 0; r < 4; ++r) {
    in.rank = r;
    auto rp = make_rank_plan(in);
    ASSERT_TRUE(rp.ok());
    EXPECT_EQ(rp->own, (std::vector<uint32_t>{0, 2}));
    EXPECT_EQ(rp->received, (std::vector<uint32_t>{1}));
    EXPECT_EQ(rp->shared_bytes, 30u);  // only the norm moves
    EXPECT_EQ(rp->own_bytes, (std::vector<uint64_t>{120, 120, 120, 120}));
  }
  auto count = readers(in);
  EXPECT_EQ(count.size(), 510u);
  for (auto& [off, n] : count) ASSERT_EQ(n, 1) << off;
}

TEST(RankPlan, ExpertsOnlyOneRankWantsAreItsOwnAndLevelTheShares) {
  RankPlanInput in;
  in.world = 2;
  in.block = 8;
  // expert 0 (rank 0 only, 300 bytes), expert 1 (rank 1 only, 100), shared 200, unwanted 1000.
  in.tensors = {{0, 0, 300, false, 0}, {0, 300, 100, false, 0}, {0, 400, 200, false, 0}, {0, 600, 1000, false, 0}};
  in.wants = {{1, 0, 1, 0}, {0, 1, 1, 0}};
  in.rank = 0;
  auto r0 = make_rank_plan(in);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ(r0->own, (std::vector<uint32_t>{0}));
  EXPECT_EQ(r0->own_bytes, (std::vector<uint64_t>{300, 100}));
  // Water-filling: rank 1 takes the whole shared tensor (100 + 200 = 300).
  EXPECT_EQ(r0->cut, (std::vector<uint64_t>{0, 0, 200}));
  EXPECT_EQ(r0->read_bytes, (std::vector<uint64_t>{300, 300}));
  EXPECT_EQ(r0->rounds, 25u);
  auto count = readers(in);
  EXPECT_EQ(count.size(), 600u);  // the unwanted tensor is never read
  for (auto& [off, n] : count) ASSERT_EQ(n, 1) << off;
}

TEST(RankPlan, TensorsStoredInPiecesAreReadByEveryRankThatWantsThem) {
  RankPlanInput in;
  in.world = 2;
  in.block = 8;
  in.tensors = {{0, std::nullopt, 40, false, 0}, {0, 40, 0, false, 0}, {0, 40, 16, false, 0}};
  in.wants.assign(2, std::vector<char>(3, 1));
  auto rp = make_rank_plan(in);
  ASSERT_TRUE(rp.ok());
  EXPECT_EQ(rp->own, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(rp->shared_bytes, 16u);
}

TEST(RankPlan, ReadPiecesMergeRunsContiguousInAFile) {
  RankPlanInput in;
  in.world = 1;
  in.block = 1024;
  in.tensors = {{0, 100, 10, false, 0}, {0, 110, 10, false, 0}, {0, 200, 10, false, 0}, {1, 210, 10, false, 0}};
  in.world = 2;
  in.wants = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  auto rp = make_rank_plan(in);
  ASSERT_TRUE(rp.ok());
  auto pieces = read_pieces(*rp, 5, 35);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].file_off, 105u);
  EXPECT_EQ(pieces[0].len, 15u);  // two tensors, one read
  EXPECT_EQ(pieces[0].buf_off, 0u);
  EXPECT_EQ(pieces[1].file_off, 200u);
  EXPECT_EQ(pieces[1].buf_off, 15u);
  EXPECT_EQ(pieces[2].file, 1u);  // another file: another read
  EXPECT_EQ(pieces[2].len, 5u);
  EXPECT_EQ(first_extent(*rp, 0), 0u);
  EXPECT_EQ(first_extent(*rp, 10), 1u);
  EXPECT_EQ(first_extent(*rp, 40), 4u);
}

TEST(RankPlan, RejectsBadInput) {
  RankPlanInput in = replica(2, 0, {10}, 8);
  auto bad = [](RankPlanInput x) { return make_rank_plan(x).status().message(); };
  RankPlanInput a = in;
  a.world = 0;
  EXPECT_NE(bad(a).find("world size 0"), std::string::npos);
  a = in;
  a.rank = 2;
  EXPECT_NE(bad(a).find("rank 2 is outside"), std::string::npos);
  a = in;
  a.block = 0;
  EXPECT_NE(bad(a).find("block"), std::string::npos);
  a = in;
  a.wants.pop_back();
  EXPECT_NE(bad(a).find("wants of 1 ranks"), std::string::npos);
  a = in;
  a.wants[1].push_back(1);
  EXPECT_NE(bad(a).find("rank 1 wants 2 tensors of 1"), std::string::npos);
  a = in;
  a.tensors = {{0, UINT64_MAX - 4, 10, false, 0}};
  EXPECT_NE(bad(a).find("overflows"), std::string::npos);
}

}  // namespace
}  // namespace wl::engine

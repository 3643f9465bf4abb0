// Private: the rank plan of a distributed load. W ranks load one checkpoint
// and every byte of it that any rank needs is read from storage by exactly
// one rank:
//   own      a tensor only one rank keeps (its tensor-parallel shard of a
//            split tensor, an expert only it holds) is read by that rank
//            straight into its destination; nothing of it moves
//   shared   tensors two or more ranks keep whole are laid end to end (in
//            checkpoint order) as one stream, cut into W contiguous slices
//            sized so that each rank's total reads (own + slice) are as equal
//            as bytes allow (not file counts), and exchanged in rounds: in
//            round i rank k contributes the next `block` bytes of its slice,
//            and one in-place all-gather of W blocks gives every rank the
//            round's W blocks; each keeps the tensors it wants
// Tensors whose bytes are not one contiguous range of the file (a few
// PyTorch views) cannot be cut by bytes: every rank that wants one reads it.
// Pure functions and values; no I/O; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "weightlift/status.h"

namespace wl::engine {

struct RankTensor {
  uint32_t file = 0;
  std::optional<uint64_t> file_offset;  // contiguous storage in the file
  uint64_t nbytes = 0;                  // the whole tensor in the file
  // Split along a dim among all W ranks (a shard rule matched): each rank
  // that wants it reads and keeps only its own shard of `shard_nbytes`.
  bool split = false;
  uint64_t shard_nbytes = 0;
};

struct RankPlanInput {
  int world = 1, rank = 0;
  std::vector<RankTensor> tensors;       // checkpoint order (file order, then offset order)
  std::vector<std::vector<char>> wants;  // [rank][tensor]: that rank delivers the tensor
  uint64_t block = 0;                    // bytes each rank contributes per exchange round (at most)
};

// Bytes [pos, pos+len) of the shared stream: bytes [file_off, +len) of a
// file, which are bytes [dst_off, +len) of a tensor.
struct SharedExtent {
  uint64_t pos = 0, len = 0;
  uint32_t file = 0;
  uint64_t file_off = 0;
  uint32_t tensor = 0;
  uint64_t dst_off = 0;
};

// One read: bytes [file_off, +len) of a file to offset buf_off of a buffer;
// `tensor` is the first tensor it covers (for error messages).
struct ReadPiece {
  uint32_t file = 0;
  uint64_t file_off = 0, len = 0, buf_off = 0;
  uint32_t tensor = 0;
};

struct RankPlan {
  int world = 1, rank = 0;
  // Tensors this rank reads itself and keeps (its shards, tensors only it
  // wants, tensors stored in pieces); checkpoint order.
  std::vector<uint32_t> own;
  // Tensors of the shared stream this rank keeps; checkpoint order.
  std::vector<uint32_t> received;
  std::vector<SharedExtent> shared;  // by pos
  uint64_t shared_bytes = 0;
  std::vector<uint64_t> cut;         // world+1 cut points: rank k reads [cut[k], cut[k+1])
  std::vector<uint64_t> own_bytes;   // per rank: bytes it reads for itself
  std::vector<uint64_t> read_bytes;  // per rank: own + its slice (what the balance equalizes)
  uint64_t block = 0, rounds = 0;    // block: the input's, or the largest slice when smaller

  // Rank k's bytes of round i, as a range of the shared stream (empty when
  // its slice is used up; the block is then padding).
  std::pair<uint64_t, uint64_t> slice(int k, uint64_t round) const;
  // The exchange block of round i: the longest of the ranks' slices in it
  // (`block` but in a last, shorter round).
  uint64_t round_block(uint64_t round) const;
};

// kInvalidArgument for a world below 1, a rank outside it, wants that do not
// match the tensors, a zero block, or sizes that overflow 64 bits.
Result<RankPlan> make_rank_plan(const RankPlanInput& in);

// The reads that bring shared-stream bytes [a, b) into a buffer (byte a at
// offset 0): one per run contiguous in one file.
std::vector<ReadPiece> read_pieces(const RankPlan& rp, uint64_t a, uint64_t b);

// The index of the first shared extent that ends after `pos`.
size_t first_extent(const RankPlan& rp, uint64_t pos);

}  // namespace wl::engine

// Distributed loading (LoadOptions.collective) with W threads as the ranks
// (tests/thread_collective.h): identical tensors to a single-process load,
// every byte read once in total, and every rank failing alike, in bounded
// time, when one rank fails. The multi-process runs over MPI and
// torch.distributed are tests/python/test_distributed.py.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "engine_test_util.h"
#include "gpu/api.h"
#include "gpu/fake.h"
#include "test_util.h"
#include "thread_collective.h"
#include "weightlift/gpu.h"

namespace wl {
namespace {

using testing::load_all;
using testing::make_f32;
using testing::ThreadGroup;
using testing::write_st;

struct RankResult {
  Status status;
  std::map<std::string, std::string> tensors;
  LoadStats stats;
};

class DistributedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three files of unequal sizes; shardable rows (divisible by 4), expert
    // weights, a norm, a scalar and an empty tensor.
    write_st(file(0), {{"model.embed.weight", make_f32({64, 48}, 1)}, {"model.norm.weight", make_f32({48}, 2)}});
    write_st(file(1), {{"model.layers.0.q_proj.weight", make_f32({32, 48}, 3)},
                       {"model.layers.0.o_proj.weight", make_f32({48, 32}, 4)},
                       {"model.layers.0.mlp.experts.0.up_proj.weight", make_f32({16, 48}, 5)},
                       {"model.layers.0.mlp.experts.1.up_proj.weight", make_f32({16, 48}, 6)},
                       {"model.layers.0.mlp.experts.2.up_proj.weight", make_f32({16, 48}, 7)},
                       {"model.layers.0.mlp.experts.3.up_proj.weight", make_f32({16, 48}, 8)}});
    write_st(file(2),
             {{"scale", make_f32({}, 9)}, {"empty", make_f32({0, 4}, 10)}, {"lm_head.weight", make_f32({8, 48}, 11)}});
    files_ = {file(0), file(1), file(2)};
    auto all = load_all(files_, LoadOptions{});
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    for (auto& t : *all) total_ += t.second.size();
  }
  std::string file(int i) const { return tmp_.file(fmt::format("model-{:05d}-of-00003.safetensors", i + 1)); }

  // Runs W ranks; `adjust` may change each rank's options and files.
  std::vector<RankResult> run(int world, std::function<void(int, LoadOptions&, std::vector<std::string>&)> adjust = {},
                              std::chrono::milliseconds timeout = std::chrono::seconds(20),
                              std::function<Status(int, LoadedTensor&)> on_tensor = {}) {
    ThreadGroup g(world, timeout);
    std::vector<RankResult> out(static_cast<size_t>(world));
    std::vector<std::unique_ptr<Collective>> members;
    for (int r = 0; r < world; ++r) members.push_back(g.member(r));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        LoadOptions o;
        o.collective = members[static_cast<size_t>(r)].get();
        o.block_size = 4096;  // 16 KiB blocks: many rounds
        o.direct = Toggle::kOff;
        o.threads = 2;
        std::vector<std::string> files = files_;
        if (adjust) adjust(r, o, files);
        RankResult& res = out[static_cast<size_t>(r)];
        auto st = load_files(files, o, [&](LoadedTensor&& t) -> Status {
          if (on_tensor) WL_RETURN_IF_ERROR(on_tensor(r, t));
          res.tensors[t.name] = std::string(reinterpret_cast<const char*>(t.view.data()), t.view.nbytes());
          return Status();
        });
        if (st.ok())
          res.stats = *st;
        else
          res.status = st.status();
      });
    for (auto& t : ts) t.join();
    return out;
  }

  testing::TempDir tmp_;
  std::vector<std::string> files_;
  uint64_t total_ = 0;
};

TEST_F(DistributedTest, EveryRankGetsTheSingleProcessTensorsReadingOnceInTotal) {
  auto single = *load_all(files_, LoadOptions{});
  for (int w : {1, 2, 3, 4}) {
    auto res = run(w);
    uint64_t read = 0, lo = UINT64_MAX, hi = 0;
    for (int r = 0; r < w; ++r) {
      const RankResult& x = res[static_cast<size_t>(r)];
      ASSERT_TRUE(x.status.ok()) << "world " << w << " rank " << r << ": " << x.status.to_string();
      EXPECT_EQ(x.tensors, single) << "world " << w << " rank " << r;
      EXPECT_EQ(x.stats.tensors, single.size());
      EXPECT_EQ(x.stats.strategy, Strategy::kStream);
      read += x.stats.bytes_read;
      lo = std::min(lo, x.stats.bytes_read), hi = std::max(hi, x.stats.bytes_read);
    }
    EXPECT_EQ(read, total_) << "world " << w;  // buffered reads: exactly the tensors' bytes
    EXPECT_LE(hi - lo, 1u) << "world " << w;   // balanced by bytes
  }
}

TEST_F(DistributedTest, CallerDestinationsReceiveThroughExchangeBuffers) {
  // A caller's memory (vLLM's parameters) on any rank: every rank then
  // exchanges through buffers and copies into the regions, the same bytes.
  auto single = *load_all(files_, LoadOptions{});
  for (bool all_callers : {true, false}) {
    std::vector<std::unique_ptr<Destination>> dests;
    std::mutex mu;
    std::vector<std::shared_ptr<Buffer>> keep;
    for (int r = 0; r < 3; ++r)
      dests.push_back(caller_destination([&](const TensorRequest& req) -> Result<Region> {
        WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(req.nbytes)));
        auto owner = std::make_shared<Buffer>(std::move(b));
        std::lock_guard lk(mu);
        keep.push_back(owner);
        return Region{owner->data(), req.nbytes, kCpu, nullptr};
      }));
    auto res = run(3, [&](int r, LoadOptions& o, std::vector<std::string>&) {
      if (all_callers || r == 1) o.destination = dests[static_cast<size_t>(r)].get();
    });
    for (auto& x : res) {
      ASSERT_TRUE(x.status.ok()) << x.status.to_string();
      EXPECT_EQ(x.tensors, single);
      // Exchange blocks carry a 64-byte trailer each: more than the bytes themselves.
      EXPECT_GT(x.stats.bytes_exchanged, total_ * 2 / 3);
    }
  }
}

TEST_F(DistributedTest, ShardRulesGiveEachRankOnlyItsShard) {
  std::vector<ShardRule> rules = {{"*.q_proj.weight", 0}, {"*.o_proj.weight", 1}, {"model.embed.weight", 0}};
  const int w = 4;
  auto res = run(w, [&](int, LoadOptions& o, std::vector<std::string>&) { o.shard_rules = rules; });
  uint64_t read = 0, replicated = 0;
  auto single = *load_all(files_, LoadOptions{});
  for (auto& [name, bytes] : single)
    if (!find_shard_rule(rules, name)) replicated += bytes.size();
  for (int r = 0; r < w; ++r) {
    const RankResult& x = res[static_cast<size_t>(r)];
    ASSERT_TRUE(x.status.ok()) << x.status.to_string();
    // Only the replicated tensors move: the others' slices of them, in blocks with a 64-byte trailer.
    EXPECT_GT(x.stats.bytes_exchanged, 0u);
    EXPECT_LE(x.stats.bytes_exchanged, replicated * (w - 1) / w + w * 64 + w) << "rank " << r;
    LoadOptions one;
    one.shard_rules = rules;
    one.tp_rank = r;
    one.tp_size = w;
    EXPECT_EQ(x.tensors, *load_all(files_, one)) << "rank " << r;
    EXPECT_EQ(x.tensors.at("model.layers.0.q_proj.weight").size(), 32u * 48 * 4 / w);
    read += x.stats.bytes_read;
  }
  EXPECT_EQ(read, total_);  // the shards once each, the replicated tensors once in total
}

TEST_F(DistributedTest, LocalExpertsMayDifferByRankAndOthersExpertsAreNeverRead) {
  const int w = 2;
  auto experts = [](int r) { return std::set<int64_t>{r, 2}; };  // expert 2 on both ranks
  auto res = run(w, [&](int r, LoadOptions& o, std::vector<std::string>&) { o.local_experts = experts(r); });
  uint64_t read = 0;
  for (int r = 0; r < w; ++r) {
    const RankResult& x = res[static_cast<size_t>(r)];
    ASSERT_TRUE(x.status.ok()) << x.status.to_string();
    LoadOptions one;
    one.local_experts = experts(r);
    EXPECT_EQ(x.tensors, *load_all(files_, one)) << "rank " << r;
    EXPECT_EQ(x.stats.skipped_tensors, 2u);
    read += x.stats.bytes_read;
  }
  EXPECT_EQ(read, total_ - 16u * 48 * 4);  // expert 3 is nobody's
}

TEST_F(DistributedTest, AMissingShardOnOneRankFailsEveryRankBeforeTheExchange) {
  auto res = run(2, [&](int r, LoadOptions&, std::vector<std::string>& files) {
    if (r == 1) files[1] = tmp_.file("gone.safetensors");
  });
  EXPECT_EQ(res[1].status.code(), Code::kNotFound) << res[1].status.to_string();
  EXPECT_NE(res[1].status.to_string().find("gone.safetensors"), std::string::npos);
  EXPECT_EQ(res[0].status.code(), Code::kAborted);
  EXPECT_NE(res[0].status.to_string().find("rank 1 of 2 failed before the exchange"), std::string::npos)
      << res[0].status.to_string();
  EXPECT_NE(res[0].status.to_string().find("gone.safetensors"), std::string::npos);
  EXPECT_TRUE(res[0].tensors.empty());
}

TEST_F(DistributedTest, ABadFileOnOneRankFailsEveryRank) {
  const std::string bad = tmp_.file("bad.safetensors");
  testing::write_bytes(bad, std::string("\x10\0\0\0\0\0\0\0{not json here}", 24));
  auto res = run(3, [&](int r, LoadOptions&, std::vector<std::string>& files) {
    if (r == 2) files[0] = bad;
  });
  EXPECT_EQ(res[2].status.code(), Code::kCorruptData) << res[2].status.to_string();
  for (int r : {0, 1}) {
    EXPECT_NE(res[static_cast<size_t>(r)].status.to_string().find("rank 2 of 3 failed before the exchange"),
              std::string::npos)
        << res[static_cast<size_t>(r)].status.to_string();
    EXPECT_NE(res[static_cast<size_t>(r)].status.to_string().find("bad.safetensors"), std::string::npos);
  }
}

TEST_F(DistributedTest, MismatchedCheckpointsAreDetectedBeforeAnyExchange) {
  const std::string other = tmp_.file("other.safetensors");
  write_st(other, {{"model.embed.weight", make_f32({64, 40}, 1)}, {"model.norm.weight", make_f32({48}, 2)}});
  auto res = run(2, [&](int r, LoadOptions&, std::vector<std::string>& files) {
    if (r == 1) files[0] = other;
  });
  for (int r : {0, 1}) {
    const Status& s = res[static_cast<size_t>(r)].status;
    EXPECT_EQ(s.code(), Code::kAborted);
    EXPECT_NE(s.to_string().find("ranks disagree on the checkpoint: file 1 of 3 ('other.safetensors' on rank 1, "
                                 "'model-00001-of-00003.safetensors' on rank 0) has a different header"),
              std::string::npos)
        << s.to_string();
  }
  // Different shard rules are a mismatch too.
  res = run(2, [&](int r, LoadOptions& o, std::vector<std::string>&) {
    if (r == 0) o.shard_rules = {{"*.q_proj.weight", 0}};
  });
  EXPECT_NE(res[1].status.to_string().find("ranks disagree on the shard rules"), std::string::npos)
      << res[1].status.to_string();
}

TEST_F(DistributedTest, ASinkFailingOnOneRankMidwayFailsEveryRank) {
  auto host = host_destination();
  for (bool buffers : {false, true}) {  // the arena, or exchange buffers (a destination was given)
    auto res = run(
        2,
        [&](int, LoadOptions& o, std::vector<std::string>&) {
          if (buffers) o.destination = host.get();
        },
        std::chrono::seconds(20),
        [](int r, LoadedTensor& t) -> Status {
          if (r == 0 && t.name == "model.layers.0.o_proj.weight")
            return Status::IoError("the consumer ran out of room");
          return Status();
        });
    EXPECT_EQ(res[0].status.code(), Code::kIoError);
    EXPECT_NE(res[1].status.to_string().find("rank 0 of 2 failed"), std::string::npos) << res[1].status.to_string();
    EXPECT_NE(res[1].status.to_string().find("the consumer ran out of room"), std::string::npos);
  }
}

TEST_F(DistributedTest, ARankThatGoesAwayFailsTheOthersWithinTheTimeout) {
  // Rank 1 is "killed" in the middle of the exchange: its collective breaks
  // the group (as a dead peer's closed connection does).
  const int w = 3;
  ThreadGroup g(w, std::chrono::seconds(20));
  std::vector<RankResult> res(w);
  std::vector<std::thread> ts;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < w; ++r)
    ts.emplace_back([&, r] {
      auto member = g.member(r);
      LoadOptions o;
      o.collective = member.get();
      o.block_size = 4096;
      o.direct = Toggle::kOff;
      int n = 0;
      auto st = load_files(files_, o, [&](LoadedTensor&&) -> Status {
        if (r == 1 && ++n == 3) member->abort(Status::Aborted("connection closed by peer"));
        return Status();
      });
      res[static_cast<size_t>(r)].status = st.ok() ? Status() : st.status();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < w; ++r) {
    EXPECT_EQ(res[static_cast<size_t>(r)].status.code(), Code::kAborted) << r;
    EXPECT_NE(res[static_cast<size_t>(r)].status.to_string().find("connection closed by peer"), std::string::npos)
        << res[static_cast<size_t>(r)].status.to_string();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST_F(DistributedTest, ARankThatStopsAnsweringMakesTheOthersTimeOut) {
  ThreadGroup g(2, std::chrono::milliseconds(500));
  auto m0 = g.member(0);
  auto m1 = g.member(1);  // never called: a hung rank
  LoadOptions o;
  o.collective = m0.get();
  auto t0 = std::chrono::steady_clock::now();
  auto st = load_files(files_, o, [](LoadedTensor&&) { return Status(); });
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().to_string().find("did not answer within 500 ms"), std::string::npos) << st.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(DistributedTest, TensorParallelOptionsMustBeTheRanks) {
  auto res = run(2, [&](int, LoadOptions& o, std::vector<std::string>&) {
    o.tp_rank = 0;
    o.tp_size = 4;
  });
  for (auto& x : res) {
    EXPECT_EQ(x.status.code(), Code::kInvalidArgument);
    EXPECT_NE(x.status.to_string().find("must be the collective's rank"), std::string::npos) << x.status.to_string();
  }
}

TEST_F(DistributedTest, ThreadedRanksOverManyRoundsWithTinyBlocksAndACap) {
  // max_memory shrinks the exchange blocks to the 4 KiB minimum: many rounds.
  auto single = *load_all(files_, LoadOptions{});
  auto res = run(2, [&](int, LoadOptions& o, std::vector<std::string>&) { o.max_memory = 8192; });
  for (auto& x : res) {
    ASSERT_TRUE(x.status.ok()) << x.status.to_string();
    EXPECT_EQ(x.tensors, single);
  }
}

}  // namespace
}  // namespace wl

// ---- device collectives, on the GPU component's host fake ------------------

namespace wl {
namespace {

// A device collective for the runner's device path: exchange memory is the
// fake's device memory; the exchange itself stages through a ThreadGroup.
class FakeDeviceMember final : public Collective {
 public:
  FakeDeviceMember(std::unique_ptr<Collective> host) : host_(std::move(host)), a_(gpu::backend().api()) {}
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  Device device() const override { return Device{DeviceKind::kCuda, 0}; }
  Status all_gather(std::byte* buf, uint64_t block) override {
    std::vector<std::byte> tmp(block * static_cast<uint64_t>(world_size()));
    WL_RETURN_IF_ERROR(copy(tmp.data(), kCpu, buf, device(), tmp.size()));
    WL_RETURN_IF_ERROR(host_->all_gather(tmp.data(), block));
    return copy(buf, device(), tmp.data(), kCpu, tmp.size());
  }
  Status broadcast(std::byte*, uint64_t, int) override { return Status::Unimplemented("not used"); }
  Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    return host_->all_gather_strings(mine);
  }
  void abort(const Status& why) override { host_->abort(why); }
  Result<std::shared_ptr<std::byte>> allocate(uint64_t n) override {
    void* p = nullptr;
    if (a_.rt.malloc(&p, n) != 0) return Status::IoError("fake cudaMalloc failed");
    const gpu::Api* a = &a_;
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [a](std::byte* q) { (void)a->rt.free(q); });
  }
  Status copy(std::byte* dst, Device, const std::byte* src, Device, uint64_t n) override {
    return a_.rt.memcpy(dst, src, n, kCudaMemcpyDefault) == 0 ? Status() : Status::IoError("fake cudaMemcpy failed");
  }

 private:
  std::unique_ptr<Collective> host_;
  const gpu::Api& a_;
};

class DistributedFakeGpu : public DistributedTest {
 protected:
  void SetUp() override {
    gpu::fake::install({});
    DistributedTest::SetUp();
  }
  void TearDown() override { gpu::fake::uninstall(); }
};

TEST_F(DistributedFakeGpu, ADeviceCollectiveExchangesThroughDeviceMemory) {
  // Exchange buffers on the (fake) device: reads staged on the host and copied
  // up, all-gathers of device memory, flags and bytes copied out of it.
  auto single = *load_all(files_, LoadOptions{});
  for (int w : {2, 3}) {
    ThreadGroup g(w);
    std::vector<RankResult> res(static_cast<size_t>(w));
    std::vector<std::thread> ts;
    for (int r = 0; r < w; ++r)
      ts.emplace_back([&, r] {
        FakeDeviceMember member(g.member(r));
        LoadOptions o;
        o.collective = &member;
        o.block_size = 4096;
        o.direct = Toggle::kOff;
        auto st = load_all(files_, o, &res[static_cast<size_t>(r)].stats);
        if (st.ok())
          res[static_cast<size_t>(r)].tensors = *st;
        else
          res[static_cast<size_t>(r)].status = st.status();
      });
    for (auto& t : ts) t.join();
    for (auto& x : res) {
      ASSERT_TRUE(x.status.ok()) << x.status.to_string();
      EXPECT_EQ(x.tensors, single);
    }
    EXPECT_GT(gpu::fake::stats().device_allocs.load(), 0u);
  }
}

TEST_F(DistributedFakeGpu, HostCollectiveIntoCudaDestinations) {
  // torch.distributed's gloo group with each rank loading to its GPU (the
  // fastsafetensors iterator's road): the destination's ring is made on the
  // first use, though the distributed loader never calls its reserve().
  auto single = *load_all(files_, LoadOptions{});
  ThreadGroup g(2);
  std::vector<std::map<std::string, std::string>> got(2);
  std::vector<Status> st(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto member = g.member(r);
      auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
      if (!dest.ok()) return void(st[static_cast<size_t>(r)] = dest.status());
      LoadOptions o;
      o.collective = member.get();
      o.block_size = 4096;
      o.direct = Toggle::kOff;
      o.destination = dest->get();
      auto res = load_files(files_, o, [&](LoadedTensor&& t) -> Status {
        std::string bytes(t.view.nbytes(), '\0');
        WL_RETURN_IF_ERROR(gpu::copy_to_host(t.view, std::as_writable_bytes(std::span(bytes.data(), bytes.size()))));
        got[static_cast<size_t>(r)][t.name] = std::move(bytes);
        return Status();
      });
      st[static_cast<size_t>(r)] = res.status();
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[static_cast<size_t>(r)].ok()) << st[static_cast<size_t>(r)].to_string();
    EXPECT_EQ(got[static_cast<size_t>(r)], single) << "rank " << r;
  }
}

TEST_F(DistributedFakeGpu, TheNcclCollectiveRunsOnTheGpuTable) {
  const WlNccl* n = gpu::backend().nccl().fn;
  ASSERT_NE(n, nullptr);
  void* comm = nullptr;
  WlNcclUniqueId id{};
  ASSERT_EQ(n->commInitRank(&comm, 1, id, 0), 0);
  auto c = nccl_collective(comm, nullptr, 0, std::chrono::seconds(5));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)->rank(), 0);
  EXPECT_EQ((*c)->world_size(), 1);
  EXPECT_EQ((*c)->device().to_string(), "cuda:0");
  auto strs = (*c)->all_gather_strings("hello");
  ASSERT_TRUE(strs.ok()) << strs.status().to_string();
  EXPECT_EQ(*strs, std::vector<std::string>{"hello"});
  auto mem = (*c)->allocate(64);
  ASSERT_TRUE(mem.ok());
  std::string in(64, 'x'), out(64, '\0');
  ASSERT_TRUE((*c)->copy(mem->get(), (*c)->device(), reinterpret_cast<const std::byte*>(in.data()), kCpu, 64).ok());
  ASSERT_TRUE((*c)->all_gather(mem->get(), 64).ok());
  ASSERT_TRUE((*c)->broadcast(mem->get(), 64, 0).ok());
  ASSERT_TRUE((*c)->copy(reinterpret_cast<std::byte*>(out.data()), kCpu, mem->get(), (*c)->device(), 64).ok());
  EXPECT_EQ(out, in);
  // A whole load over it (a world of one: every tensor is this rank's own).
  LoadOptions o;
  o.collective = c->get();
  EXPECT_EQ(*load_all(files_, o), *load_all(files_, LoadOptions{}));
  (*c)->abort(Status::Aborted("done"));  // frees the fake communicator
  EXPECT_NE((*c)->all_gather(mem->get(), 64).to_string().find("aborted"), std::string::npos);
}

TEST(DistributedNccl, WithoutAGpuItSaysWhy) {
  if (gpu::backend().api().devices > 0) GTEST_SKIP() << "a GPU is present";
  int dummy = 0;
  auto c = nccl_collective(&dummy, nullptr, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnavailable) << c.status().to_string();
  EXPECT_EQ(nccl_collective(nullptr, nullptr, 0).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace wl

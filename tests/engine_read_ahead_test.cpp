// The read-ahead job (read_ahead.h): which bytes it reads (the load's
// tensors, the expert filter, this rank's slice, the memory bound), that a
// cached file is left alone, that a load of a remote source reads the staged
// bytes from memory and never asks the source twice, and its failures.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "engine_test_util.h"
#include "gpu/fake.h"
#include "test_util.h"
#include "weightlift/gpu.h"
#include "weightlift/read_ahead.h"

namespace wl {
namespace {

using testing::CountingEnv;
using testing::load_all;
using testing::make_f32;
using testing::TempDir;
using testing::write_st;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Two files: a layer's weights (one of them an expert's) and a head.
std::vector<std::string> two_files(const TempDir& dir) {
  write_st(dir.file("a.safetensors"),
           {{"model.layers.0.attn.weight", make_f32({512, 1024}, 1)},                  // 2 MiB
            {"model.layers.0.mlp.experts.3.up_proj.weight", make_f32({512, 512}, 2)},  // 1 MiB
            {"model.norm.weight", make_f32({1024}, 3)}});
  write_st(dir.file("b.safetensors"), {{"lm_head.weight", make_f32({1024, 1024}, 4)}});  // 4 MiB
  return {dir.file("a.safetensors"), dir.file("b.safetensors")};
}

// Bytes the job paged in (the planner's header reads, at offsets 0 and 8, left out).
uint64_t populated(const CountingEnv& env, const std::string& path = "") {
  uint64_t n = 0;
  for (auto& r : env.reads())
    if ((path.empty() || r.path == path) && r.offset > 8) n += r.len;
  return n;
}

TEST(ReadAhead, ColdLocalFilesArePagedInTensorByTensorInTheLoadsOrder) {
  TempDir dir;
  auto files = two_files(dir);
  CountingEnv env;
  env.cached = 0.0;  // every file reads as cold
  ReadAheadOptions o;
  o.env = &env;
  o.block_size = kMiB;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok()) << ra.status().to_string();
  ASSERT_TRUE((*ra)->wait().ok());
  ReadAheadProgress p = (*ra)->progress();
  const uint64_t tensors = (2 + 1 + 4) * kMiB + 4096;
  EXPECT_TRUE(p.done && p.planned && !p.remote);
  EXPECT_EQ(p.bytes_planned, tensors);
  EXPECT_EQ(p.bytes_read, tensors);
  EXPECT_EQ(p.bytes_cached, 0u);
  EXPECT_EQ(populated(env), tensors);  // the tensors' bytes, once each; nothing else
  EXPECT_EQ(populated(env, files[1]), 4 * kMiB);
}

TEST(ReadAhead, OtherRanksExpertsAreNeverRead) {
  TempDir dir;
  auto files = two_files(dir);
  CountingEnv env;
  env.cached = 0.0;
  ReadAheadOptions o;
  o.env = &env;
  o.local_experts = std::set<int64_t>{0, 1};  // expert 3 is another rank's
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait().ok());
  EXPECT_EQ((*ra)->progress().bytes_planned, (2 + 4) * kMiB + 4096);
  EXPECT_EQ(populated(env), (2 + 4) * kMiB + 4096);
}

TEST(ReadAhead, CachedFilesAreLeftAlone) {
  TempDir dir;
  auto files = two_files(dir);
  CountingEnv env;
  env.cached = 1.0;
  ReadAheadOptions o;
  o.env = &env;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait().ok());
  ReadAheadProgress p = (*ra)->progress();
  EXPECT_EQ(p.bytes_cached, p.bytes_planned);
  EXPECT_EQ(p.bytes_read, 0u);
  EXPECT_EQ(populated(env), 0u);
}

TEST(ReadAhead, TheRanksOfAHostReadDisjointSlicesThatCoverEverything) {
  TempDir dir;
  auto files = two_files(dir);
  const uint64_t tensors = (2 + 1 + 4) * kMiB + 4096;
  std::map<std::pair<std::string, uint64_t>, int> seen;
  uint64_t sum = 0;
  for (int rank = 0; rank < 3; ++rank) {
    CountingEnv env;
    env.cached = 0.0;
    env.cached_in = 1.0;  // the other ranks' slices are in the page cache: no help needed
    ReadAheadOptions o;
    o.env = &env;
    o.block_size = 256 << 10;
    o.rank = rank, o.world_size = 3;
    auto ra = ReadAhead::start(files, o);
    ASSERT_TRUE(ra.ok());
    ASSERT_TRUE((*ra)->wait().ok());
    const uint64_t mine = (*ra)->progress().bytes_read;
    EXPECT_NEAR(static_cast<double>(mine), tensors / 3.0, 1.0) << "rank " << rank;
    EXPECT_EQ((*ra)->progress().bytes_helped, 0u);
    EXPECT_EQ(populated(env), mine);
    sum += mine;
    for (auto& r : env.reads())
      if (r.offset > 8) seen[{r.path, r.offset}]++;
  }
  EXPECT_EQ(sum, tensors);
  for (auto& [where, n] : seen) EXPECT_EQ(n, 1) << where.first << " @" << where.second;
}

// A rank done with its slice reads what the page cache still lacks of the
// others' (a slow rank's), its own slice first.
TEST(ReadAhead, ARankDoneWithItsSliceHelpsWithTheOthers) {
  TempDir dir;
  auto files = two_files(dir);
  const uint64_t tensors = (2 + 1 + 4) * kMiB + 4096;
  CountingEnv env;
  env.cached = 0.0;  // nothing cached: every other slice is helped with
  ReadAheadOptions o;
  o.env = &env;
  o.threads = 1;
  o.block_size = 256 << 10;
  o.rank = 1, o.world_size = 3;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait().ok());
  ReadAheadProgress p = (*ra)->progress();
  EXPECT_NEAR(static_cast<double>(p.bytes_read), tensors / 3.0, 1.0);
  EXPECT_EQ(p.bytes_read + p.bytes_helped, tensors);
  EXPECT_EQ(populated(env), tensors);  // each byte once
  // Its own slice first: the reads of the same rank that needed no help.
  CountingEnv alone;
  alone.cached = 0.0;
  alone.cached_in = 1.0;
  o.env = &alone;
  ASSERT_TRUE((*ReadAhead::start(files, o))->wait().ok());
  std::set<std::pair<std::string, uint64_t>> own, first;
  for (auto& r : alone.reads())
    if (r.offset > 8) own.insert({r.path, r.offset});
  for (auto& r : env.reads())
    if (r.offset > 8 && first.size() < own.size()) first.insert({r.path, r.offset});
  EXPECT_EQ(first, own);
  // Under a bound that leaves bytes to the load, no help: the bound is per rank.
  CountingEnv tight;
  tight.cached = 0.0;
  o.env = &tight;
  o.max_memory = kMiB;
  auto capped = ReadAhead::start(files, o);
  ASSERT_TRUE(capped.ok());
  ASSERT_TRUE((*capped)->wait().ok());
  EXPECT_EQ((*capped)->progress().bytes_helped, 0u);
  EXPECT_EQ(populated(tight), (*capped)->progress().bytes_read);
}

TEST(ReadAhead, TheMemoryBoundLeavesTheRestToTheLoad) {
  TempDir dir;
  auto files = two_files(dir);
  CountingEnv env;
  env.cached = 0.0;
  ReadAheadOptions o;
  o.env = &env;
  o.block_size = kMiB;
  o.max_memory = 3 * kMiB;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait().ok());
  ReadAheadProgress p = (*ra)->progress();
  EXPECT_EQ(p.bytes_read, 3 * kMiB);
  EXPECT_EQ(p.bytes_capped, p.bytes_planned - 3 * kMiB);
  EXPECT_LE(populated(env), 3 * kMiB);
}

// The tensors named first are paged in before the others; each pass is split
// among the ranks on its own; the bound admits the first pass first.
TEST(ReadAhead, TheTensorsNamedFirstAreReadFirstEachPassSplitAmongTheRanks) {
  TempDir dir;
  auto files = two_files(dir);
  auto first = [](std::string_view name) { return name == "lm_head.weight" || name == "model.norm.weight"; };
  const uint64_t head = 4 * kMiB + 4096, rest = 3 * kMiB;
  auto run = [&](int rank, int world, uint64_t max_memory, std::vector<testing::ReadRecord>* reads) {
    CountingEnv env;
    env.cached = 0.0;
    ReadAheadOptions o;
    o.env = &env;
    o.threads = 1;  // one thread: the reads in the job's order
    o.block_size = kMiB;
    o.max_memory = max_memory;
    o.rank = rank, o.world_size = world;
    o.first = first;
    auto ra = ReadAhead::start(files, o);
    EXPECT_TRUE(ra.ok());
    EXPECT_TRUE((*ra)->wait().ok());
    for (auto& r : env.reads())
      if (r.offset > 8) reads->push_back(r);
    return (*ra)->progress();
  };
  std::vector<testing::ReadRecord> reads;
  ReadAheadProgress p = run(0, 1, 0, &reads);
  EXPECT_EQ(p.bytes_read, head + rest);
  uint64_t n = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    const bool in_head = reads[i].path == files[1] || reads[i].offset >= 3 * kMiB;  // norm lies after the experts
    EXPECT_EQ(in_head, n < head) << "read " << i << ": " << reads[i].path << " @" << reads[i].offset;
    n += reads[i].len;
  }
  // Two ranks: each reads half of each pass, the first pass first.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<testing::ReadRecord> mine;
    EXPECT_EQ(run(rank, 2, 0, &mine).bytes_read, (head + rest) / 2) << "rank " << rank;
    uint64_t got = 0, head_bytes = 0;
    for (auto& r : mine) {
      if (got < head / 2) head_bytes += r.len;
      got += r.len;
    }
    EXPECT_EQ(head_bytes, head / 2) << "rank " << rank;
  }
  // A bound of 4 MiB admits the first pass's blocks that fit (the norm and 3 of
  // lm_head's 1 MiB blocks), nothing of the second.
  std::vector<testing::ReadRecord> bounded;
  p = run(0, 1, 4 * kMiB, &bounded);
  EXPECT_EQ(p.bytes_read, 3 * kMiB + 4096);
  EXPECT_EQ(p.bytes_capped, head + rest - p.bytes_read);
  for (auto& r : bounded) EXPECT_TRUE(r.path == files[1] || r.offset >= 3 * kMiB) << r.path << " @" << r.offset;
}

// Local files: the threads take runs of 4 consecutive blocks, each read front
// to back by one thread (threads paging in neighbouring blocks of one file
// fight over the same pages).
TEST(ReadAhead, EachThreadReadsRunsOfConsecutiveBlocksInOrder) {
  TempDir dir;
  auto files = two_files(dir);
  auto run = [&](int threads) {
    CountingEnv env;
    env.cached = 0.0;
    env.populate_delay = std::chrono::milliseconds(5);  // every thread gets to take work
    ReadAheadOptions o;
    o.env = &env;
    o.threads = threads;
    o.block_size = kMiB;
    auto ra = ReadAhead::start(files, o);
    EXPECT_TRUE(ra.ok());
    EXPECT_TRUE((*ra)->wait().ok());
    std::vector<testing::ReadRecord> out;
    for (auto& r : env.reads())
      if (r.offset > 8) out.push_back(r);
    return out;
  };
  const auto order = run(1);  // the job's order: a.safetensors' 4 blocks, then b's 4
  ASSERT_EQ(order.size(), 8u);
  const auto reads = run(2);
  ASSERT_EQ(reads.size(), order.size());
  auto index_of = [&](const testing::ReadRecord& r) {
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i].path == r.path && order[i].offset == r.offset) return i;
    ADD_FAILURE() << "unexpected read " << r.path << " @" << r.offset;
    return order.size();
  };
  // Two runs, [0, 4) and [4, 8): each read by one thread, front to back.
  for (size_t run_begin : {size_t{0}, size_t{4}}) {
    std::vector<size_t> seen;
    std::thread::id who;
    for (auto& r : reads) {
      const size_t i = index_of(r);
      if (i < run_begin || i >= run_begin + 4) continue;
      if (seen.empty()) who = r.thread;
      EXPECT_EQ(r.thread, who) << "block " << i << " read by another thread";
      seen.push_back(i);
    }
    EXPECT_EQ(seen, (std::vector<size_t>{run_begin, run_begin + 1, run_begin + 2, run_begin + 3}));
  }
}

// ---- remote sources: staging -------------------------------------------------------------------

// "s3://fake/NAME" served from a local folder as a remote source would be
// (no mapping; every byte a counted read).
class FakeRemote final : public EnvWrapper {
 public:
  explicit FakeRemote(std::string dir) : EnvWrapper(local_env()), dir_(std::move(dir)) {}
  static constexpr std::string_view kPrefix = "s3://fake/";
  std::string local(const std::string& url) const { return dir_ + "/" + url.substr(kPrefix.size()); }
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override;
  Result<uint64_t> file_size(const std::string& path) override { return target()->file_size(local(path)); }
  bool exists(const std::string& path) override { return target()->exists(local(path)); }
  std::atomic<uint64_t> bytes{0}, requests{0};
  std::atomic<int> delay_ms{0};

 private:
  std::string dir_;
};

class FakeRemoteFile final : public RandomAccessFile {
 public:
  FakeRemoteFile(std::string url, std::shared_ptr<RandomAccessFile> f, FakeRemote* env)
      : url_(std::move(url)), f_(std::move(f)), env_(env) {}
  const std::string& path() const override { return url_; }
  uint64_t size() const override { return f_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    env_->bytes += dst.size();
    env_->requests++;
    if (env_->delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(env_->delay_ms.load()));
    return f_->read_at(offset, dst);
  }
  std::string version() const override { return f_->version(); }
  bool is_remote() const override { return true; }

 private:
  std::string url_;
  std::shared_ptr<RandomAccessFile> f_;
  FakeRemote* env_;
};

Result<std::shared_ptr<RandomAccessFile>> FakeRemote::open(const std::string& path, const OpenOptions& o) {
  OpenOptions lo = o;
  lo.mode = FileMode::kPread;
  WL_ASSIGN_OR_RETURN(auto f, target()->open(local(path), lo));
  return std::shared_ptr<RandomAccessFile>(std::make_shared<FakeRemoteFile>(path, std::move(f), this));
}

std::vector<std::string> urls(const std::vector<std::string>& files) {
  std::vector<std::string> out;
  for (auto& f : files) out.push_back(std::string(FakeRemote::kPrefix) + f.substr(f.rfind('/') + 1));
  return out;
}

TEST(ReadAhead, ARemoteLoadReadsTheStagedBytesFromMemory) {
  TempDir dir;
  auto local = two_files(dir);
  auto files = urls(local);
  FakeRemote remote(dir.path());
  LoadOptions plain;
  plain.strategy = Strategy::kStream;
  plain.env = &remote;
  auto want = load_all(files, plain);
  ASSERT_TRUE(want.ok()) << want.status().to_string();

  ReadAheadOptions o;
  o.env = &remote;
  o.block_size = kMiB;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait().ok());
  ReadAheadProgress p = (*ra)->progress();
  EXPECT_TRUE(p.remote);
  EXPECT_EQ(p.bytes_read, p.bytes_planned);
  const uint64_t before = remote.bytes;
  LoadOptions lo = plain;
  lo.env = (*ra)->env();
  auto got = load_all(files, lo);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  // Only the headers again (the planner's reads); no tensor byte.
  EXPECT_LT(remote.bytes - before, 64u << 10);
  EXPECT_EQ((*ra)->progress().bytes_consumed, p.bytes_planned);
  // The load never reached a block the job had not read: the job was not overtaken.
  EXPECT_FALSE((*ra)->progress().overtaken);
  EXPECT_EQ((*ra)->progress().bytes_read, p.bytes_planned);
}

TEST(ReadAhead, ALoadRacingTheJobUnderATightBoundReadsEachByteOnce) {
  TempDir dir;
  auto local = two_files(dir);
  auto files = urls(local);
  FakeRemote remote(dir.path());
  LoadOptions plain;
  plain.strategy = Strategy::kStream;
  plain.env = &remote;
  plain.block_size = 512 << 10;
  auto want = load_all(files, plain);
  ASSERT_TRUE(want.ok());
  const uint64_t one_load = remote.bytes;
  remote.bytes = 0;
  remote.delay_ms = 2;
  ReadAheadOptions o;
  o.env = &remote;
  o.block_size = 512 << 10;
  o.max_memory = kMiB;  // two blocks staged at most: the job waits for the load
  o.threads = 2;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  LoadOptions lo = plain;
  lo.env = (*ra)->env();
  auto got = load_all(files, lo);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  (*ra)->stop();
  ASSERT_TRUE((*ra)->wait().ok());
  // Headers twice (the job's plan and the load's), every tensor byte once,
  // by the job or by the load.
  EXPECT_LE(remote.bytes, one_load + (64u << 10));
}

// Once the load reaches a block the job has not, the job takes no further
// block: the load's own connections read the rest (the source never sees
// both at once), every byte still read once.
TEST(ReadAhead, ALoadThatOvertakesTheJobReadsTheRestAndTheJobStops) {
  TempDir dir;
  auto files = urls(two_files(dir));
  FakeRemote remote(dir.path());
  constexpr uint64_t kBlock = 128 << 10;
  LoadOptions plain;
  plain.strategy = Strategy::kStream;
  plain.env = &remote;
  plain.block_size = kBlock;
  plain.threads = 4;
  auto want = load_all(files, plain);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  const uint64_t one_load = remote.bytes;
  remote.bytes = 0;
  remote.delay_ms = 20;  // the load's 4 connections soon pass the job's one
  ReadAheadOptions o;
  o.env = &remote;
  o.block_size = kBlock;
  o.threads = 1;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait_planned().planned);
  LoadOptions lo = plain;
  lo.env = (*ra)->env();
  auto got = load_all(files, lo);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  ASSERT_TRUE((*ra)->wait().ok());  // it ended by itself: nobody called stop()
  const ReadAheadProgress p = (*ra)->progress();
  EXPECT_TRUE(p.done);
  EXPECT_TRUE(p.overtaken);
  EXPECT_LE(p.bytes_read, p.overtaken_at + kBlock) << "the job read on after the load passed it";
  EXPECT_LT(p.bytes_read, p.bytes_planned);
  EXPECT_LE(remote.bytes, one_load + (64u << 10));  // every tensor byte once, by the job or by the load
}

TEST(ReadAhead, DroppedWhileItWaitsForTheLoadItStops) {
  TempDir dir;
  auto files = urls(two_files(dir));
  FakeRemote remote(dir.path());
  ReadAheadOptions o;
  o.env = &remote;
  o.block_size = 256 << 10;
  o.max_memory = 256 << 10;  // one block, never consumed
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ASSERT_TRUE((*ra)->wait_planned().planned);
  ra->reset();  // returns: the waiting workers are woken and joined
  SUCCEED();
}

// A model built before the job has read the headers: the load asks what
// the job will cover and waits for its plan (not "not planned yet").
TEST(ReadAhead, WaitPlannedReturnsTheSizesOnceTheHeadersAreRead) {
  TempDir dir;
  auto files = urls(two_files(dir));
  FakeRemote remote(dir.path());
  remote.delay_ms = 150;  // each header read: planning takes ~0.6 s
  ReadAheadOptions o;
  o.env = &remote;
  o.block_size = kMiB;
  o.threads = 1;
  auto ra = ReadAhead::start(files, o);
  ASSERT_TRUE(ra.ok());
  ReadAheadProgress p = (*ra)->wait_planned();
  EXPECT_TRUE(p.planned);
  EXPECT_EQ(p.bytes_planned, 7 * kMiB + 4096);
  EXPECT_EQ(p.bytes_capped, 0u);
  (*ra)->stop();
  // A plan that fails: the job has ended, unplanned, and says why.
  remote.delay_ms = 0;
  auto gone = ReadAhead::start({std::string(FakeRemote::kPrefix) + "missing.safetensors"}, o);
  ASSERT_TRUE(gone.ok());
  p = (*gone)->wait_planned();
  EXPECT_FALSE(p.planned);
  EXPECT_TRUE(p.done);
  EXPECT_FALSE((*gone)->wait().ok());
}

// ---- device loads: host reads ahead, device copies only in the load ---------------------------------

// What vLLM's GPU worker does: the read-ahead runs while the model is built
// (no device memory exists yet); the load then copies into device memory
// through the pinned ring. On the fake backend: nothing reaches the device
// before the load, and the load's copies come from the staging (remote) or
// the page cache (local) without asking the source again.
TEST(ReadAheadDevice, HostReadsAheadAndDeviceCopiesOnlyInTheLoad) {
  gpu::fake::install();
  ASSERT_TRUE(gpu::set_ring_options({4, 64 << 10, 2}).ok());
  {
    TempDir dir;
    auto files = urls(two_files(dir));
    FakeRemote remote(dir.path());
    LoadOptions plain;
    plain.strategy = Strategy::kStream;
    plain.env = &remote;
    auto want = load_all(files, plain);
    ASSERT_TRUE(want.ok());
    ReadAheadOptions o;
    o.env = &remote;
    auto ra = ReadAhead::start(files, o);
    ASSERT_TRUE(ra.ok());
    ASSERT_TRUE((*ra)->wait().ok());
    EXPECT_EQ(gpu::fake::stats().async_copies.load(), 0u);  // the job never touches a device
    EXPECT_EQ(gpu::fake::stats().device_allocs.load(), 0u);
    const uint64_t before = remote.bytes;
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    ASSERT_TRUE(dest.ok()) << dest.status().to_string();
    LoadOptions lo = plain;
    lo.env = (*ra)->env();
    lo.destination = dest->get();
    std::map<std::string, std::string> got;
    auto r = load_files(files, lo, [&](LoadedTensor&& t) -> Status {
      std::string bytes(t.view.nbytes(), '\0');
      WL_RETURN_IF_ERROR(gpu::copy_to_host(t.view, std::as_writable_bytes(std::span(bytes.data(), bytes.size()))));
      got[t.name] = std::move(bytes);
      return Status();
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(got, *want);
    EXPECT_GT(gpu::fake::stats().async_copies.load(), 0u);
    EXPECT_LT(remote.bytes - before, 64u << 10);  // headers only: the tensors came from the staging
  }
  gpu::fake::uninstall();
}

// ---- failures ----------------------------------------------------------------------------------

TEST(ReadAhead, BadOptionsAreInvalidArguments) {
  EXPECT_EQ(ReadAhead::start({}, {}).status().code(), Code::kInvalidArgument);
  ReadAheadOptions o;
  o.rank = 2, o.world_size = 2;
  auto r = ReadAhead::start({"x.safetensors"}, o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rank 2 is outside [0, 2)"), std::string::npos) << r.status().to_string();
  o = {};
  o.threads = -1;
  EXPECT_EQ(ReadAhead::start({"x.safetensors"}, o).status().code(), Code::kInvalidArgument);
  o = {};
  o.block_size = uint64_t{2} << 30;
  EXPECT_EQ(ReadAhead::start({"x.safetensors"}, o).status().code(), Code::kInvalidArgument);
}

TEST(ReadAhead, AMissingOrCorruptFileIsReportedNotThrown) {
  TempDir dir;
  testing::write_bytes(dir.file("bad.safetensors"), std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{", 9));
  for (const std::string& f : {dir.file("missing.safetensors"), dir.file("bad.safetensors")}) {
    auto ra = ReadAhead::start({f}, {});
    ASSERT_TRUE(ra.ok());
    Status s = (*ra)->wait();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.to_string().find(f), std::string::npos) << s.to_string();
    EXPECT_TRUE((*ra)->progress().done);
    EXPECT_EQ((*ra)->progress().bytes_read, 0u);
  }
}

// ---- populate_read: mapped memory resident before the load returns -----------------------------

// A file of `pages` pages mapped copy-on-write (as the plug-in maps
// parameters), its page cache dropped first.
std::shared_ptr<RandomAccessFile> mapped_cold(const std::string& path, uint64_t pages) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::string bytes(pages * page, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  testing::write_bytes(path, bytes);
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  auto f = Env::Default()->open(path, {.mode = FileMode::kMmapPrivate});
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return *f;
}

// Pages of [p, p+n) in memory (mincore).
uint64_t resident_pages(const std::byte* p, uint64_t n) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p) / page * page;
  std::vector<unsigned char> vec((reinterpret_cast<uintptr_t>(p) + n - a + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(a), vec.size() * page, vec.data()) != 0) return 0;
  return static_cast<uint64_t>(std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return v & 1; }));
}

TEST(PopulateRead, MappedPagesAreReadInAndCounted) {
  TempDir dir;
  auto f = mapped_cold(dir.file("w.bin"), 64);
  auto v = f->view(0, f->size());
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  // Two ranges that do not start or end on a page boundary (11 and 41 pages), on two threads.
  const MappedRange ranges[] = {{v->data() + 100, 10 * 4096}, {v->data() + 20 * 4096 + 5, 40 * 4096}};
  const uint64_t cold = 52 - resident_pages(ranges[0].data, ranges[0].size) -
                        resident_pages(ranges[1].data, ranges[1].size);  // 52 where the drop worked
  auto st = populate_read(ranges, 2);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->bytes, 50u * 4096);
  EXPECT_EQ(st->bytes_not_resident, std::min<uint64_t>(cold * 4096, 50u * 4096));
  EXPECT_EQ(resident_pages(ranges[0].data, ranges[0].size), 11u);
  EXPECT_EQ(resident_pages(ranges[1].data, ranges[1].size), 41u);
  // Again: nothing left to read; the bytes are the file's (nothing written).
  st = populate_read(ranges);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->bytes_not_resident, 0u);
  EXPECT_EQ(static_cast<unsigned char>((*v)[4096 * 30]), static_cast<unsigned char>(4096 * 30 * 7 + 1));
}

// Ranges of many 8 MiB chunks (runs of consecutive chunks, one thread each)
// beside one-page ones: every page read in, whatever the threads.
TEST(PopulateRead, RangesOfManyChunksAreReadWhole) {
  TempDir dir;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t pages = (uint64_t{44} << 20) / page;
  for (int threads : {1, 3}) {
    auto f = mapped_cold(dir.file("big" + std::to_string(threads) + ".bin"), pages);
    auto v = f->view(0, f->size());
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    const MappedRange ranges[] = {{v->data() + 3, page},                              // 2 pages
                                  {v->data() + 2 * page, (uint64_t{41} << 20) + 17},  // 6 chunks
                                  {v->data() + pages * page - page, page}};           // the last page
    auto st = populate_read(ranges, threads);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    for (const MappedRange& r : ranges)
      EXPECT_EQ(resident_pages(r.data, r.size), (reinterpret_cast<uintptr_t>(r.data) % page + r.size + page - 1) / page)
          << "threads " << threads;
    EXPECT_EQ(static_cast<unsigned char>((*v)[page * 9000]), static_cast<unsigned char>(page * 9000 * 7 + 1));
  }
}

TEST(PopulateRead, ATruncatedFileIsAnErrorNotASignal) {
  TempDir dir;
  const std::string path = dir.file("w.bin");
  auto f = mapped_cold(path, 8);
  auto v = f->view(0, f->size());
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);  // modified in place under the mapping
  const MappedRange ranges[] = {{v->data(), 4096}, {v->data() + 4096, 7 * 4096}};
  auto st = populate_read(ranges, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kIoError);
  EXPECT_NE(st.status().message().find("range 1"), std::string::npos) << st.status().to_string();
  EXPECT_NE(st.status().message().find("truncated"), std::string::npos) << st.status().to_string();
}

TEST(PopulateRead, BadRangesAreErrors) {
  const MappedRange null_range[] = {{nullptr, 4096}};
  EXPECT_EQ(populate_read(null_range).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(populate_read({}, -1).status().code(), Code::kInvalidArgument);
  auto empty = populate_read({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->bytes, 0u);
  // Memory no longer mapped: an error naming the range, never a fault.
  void* p = ::mmap(nullptr, 4 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ::munmap(p, 4 * 4096);
  const MappedRange gone[] = {{static_cast<const std::byte*>(p), 4 * 4096}};
  auto st = populate_read(gone);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("range 0"), std::string::npos) << st.status().to_string();
}

}  // namespace
}  // namespace wl

// LoadOptions::file_views (zero-copy private views, pages mapped in first and
// released with the last view), Order, and select.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "engine_test_util.h"
#include "test_util.h"
#include "weightlift/load_plan.h"
#include "weightlift/loader.h"
#include "weightlift/synth.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::load_all;
using testing::make_f32;
using testing::TempDir;
using testing::write_st;

// Every tensor a load hands over, held (as a consumer holds what it has not copied yet).
Result<std::vector<LoadedTensor>> load_kept(const std::string& path, const LoadOptions& o) {
  std::vector<LoadedTensor> kept;
  auto r = load_files({path}, o, [&](LoadedTensor&& t) {
    kept.push_back(std::move(t));
    return Status();
  });
  if (!r.ok()) return r.status();
  return kept;
}

// The lengths of the page-ins `env` saw (mappings' populates, reads), the header's two reads left out.
std::vector<uint64_t> page_ins(const testing::CountingEnv& env) {
  std::vector<uint64_t> out;
  for (auto& rec : env.reads())
    if (!((rec.offset == 0 && rec.len == 8) || rec.offset == 8)) out.push_back(rec.len);
  return out;
}

TEST(EngineViews, EveryStrategyGivesTheSameBytesAsBuffers) {
  TempDir dir;
  SynthOptions so;
  so.target_bytes = uint64_t{2} << 20;
  so.min_shards = 2;
  ASSERT_TRUE(synth_model(dir.path(), so).ok());
  auto files = *resolve_weight_files(dir.path());
  LoadOptions base;
  base.strategy = Strategy::kLazy;
  auto ref = load_all(files, base);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch, Strategy::kThreads}) {
    LoadOptions o;
    o.strategy = s;
    o.threads = 2;
    o.file_views = true;
    auto got = load_all(files, o);
    ASSERT_TRUE(got.ok()) << strategy_name(s) << ": " << got.status().to_string();
    EXPECT_EQ(*got, *ref) << strategy_name(s);
  }
}

TEST(EngineViews, ViewsArePrivateWritableAndOutliveTheLoad) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  write_st(p, {{"a", make_f32({1024, 8}, 1)}, {"b", make_f32({3}, 2)}});
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    LoadOptions o;
    o.strategy = s;
    o.file_views = true;
    auto r = load_kept(p, o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    std::vector<LoadedTensor> kept = std::move(*r);
    ASSERT_EQ(kept.size(), 2u);
    for (auto& t : kept) EXPECT_NE(t.view.owner(), nullptr) << t.name;
    auto* f = reinterpret_cast<float*>(const_cast<std::byte*>(kept[0].view.data()));
    EXPECT_EQ(f[1], 1001.0f);
    f[1] = -1;     // copy-on-write: this process only
    kept.clear();  // releases the pages; the file is untouched
    LoadOptions plain;
    plain.strategy = Strategy::kLazy;
    auto again = load_all({p}, plain);
    ASSERT_TRUE(again.ok());
    float v;
    std::memcpy(&v, again->at("a").data() + 4, 4);
    EXPECT_EQ(v, 1001.0f) << strategy_name(s);
  }
}

TEST(EngineViews, EagerMapsAColdFileInWholeAndACachedOneTensorByTensor) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  write_st(p, {{"a", make_f32({1024, 8}, 1)}, {"b", make_f32({512}, 2)}});
  const uint64_t size = *Env::Default()->file_size(p);
  for (double cached : {0.0, 1.0}) {
    testing::CountingEnv env;
    env.cached = cached;
    LoadOptions o;
    o.strategy = Strategy::kEager;
    o.file_views = true;
    o.direct = Toggle::kOff;  // views even of a cold file
    o.env = &env;
    auto kept = load_kept(p, o);
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    ASSERT_EQ(kept->size(), 2u);
    const std::vector<uint64_t> populated = page_ins(env);
    if (cached == 0.0) {
      EXPECT_EQ(populated, std::vector<uint64_t>{size});  // one sequential pass before the first tensor
    } else {
      EXPECT_EQ(populated, (std::vector<uint64_t>{1024u * 8 * 4, 512u * 4}));  // as lazy: tensor by tensor
    }
  }
}

TEST(EngineViews, ViewsLeftUnreadAreReadOnlyByTheirFirstAccess) {
  // populate_views = false: no page-in, no readahead hint, whether the file
  // is cached or not; the bytes are the file's when the caller reads them.
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  write_st(p, {{"a", make_f32({1024, 8}, 1)}, {"b", make_f32({512}, 2)}});
  LoadOptions plain;
  plain.strategy = Strategy::kLazy;
  auto ref = load_all({p}, plain);
  ASSERT_TRUE(ref.ok());
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    for (double cached : {0.0, 1.0}) {
      testing::CountingEnv env;
      env.cached = cached;
      LoadOptions o;
      o.strategy = s;
      o.file_views = true;
      o.populate_views = false;
      o.direct = Toggle::kOff;
      o.env = &env;
      auto kept = load_kept(p, o);
      ASSERT_TRUE(kept.ok()) << kept.status().to_string();
      ASSERT_EQ(kept->size(), 2u);
      EXPECT_EQ(page_ins(env), std::vector<uint64_t>{}) << strategy_name(s) << " cached " << cached;
      EXPECT_EQ(env.will_need.load(), 0u) << strategy_name(s);
      for (auto& t : *kept) {
        ASSERT_NE(t.view.owner(), nullptr) << t.name;  // still views
        EXPECT_EQ(0, std::memcmp(t.view.data(), ref->at(t.name).data(), ref->at(t.name).size())) << t.name;
      }
      auto plan = plan_load({p}, o);
      ASSERT_TRUE(plan.ok());
      EXPECT_NE(plan->describe().find("pages left unread"), std::string::npos) << plan->describe();
    }
  }
}

TEST(EngineViews, ShardsAreStillCopied) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  write_st(p, {{"w", make_f32({4, 6}, 1)}});
  LoadOptions o;
  o.strategy = Strategy::kLazy;
  o.file_views = true;
  o.tp_rank = 1;
  o.tp_size = 2;
  o.shard_rules = {*parse_shard_rule("w:1")};
  auto got = load_all({p}, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->at("w").size(), 4u * 3 * 4);
  float v;
  std::memcpy(&v, got->at("w").data(), 4);
  EXPECT_EQ(v, 1003.0f);
}

TEST(EngineViews, ColdFilesAreStreamedIntoMemoryInstead) {
  TempDir dir;
  SynthOptions so;
  so.target_bytes = uint64_t{4} << 20;
  so.min_shards = 2;
  ASSERT_TRUE(synth_model(dir.path(), so).ok());
  auto files = *resolve_weight_files(dir.path());
  LoadOptions plain;
  plain.strategy = Strategy::kLazy;
  auto ref = load_all(files, plain);
  ASSERT_TRUE(ref.ok());
  for (auto& f : files) {  // out of the page cache
    int fd = ::open(f.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  auto probe = Env::Default()->open(files[0], {.mode = FileMode::kPread});
  ASSERT_TRUE(probe.ok());
  if ((*probe)->cached_fraction() >= 0.5) GTEST_SKIP() << "this filesystem keeps the pages (tmpfs?)";
  LoadOptions o;
  o.strategy = Strategy::kLazy;
  o.file_views = true;
  LoadStats stats;
  auto got = load_all(files, o, &stats);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(stats.strategy, Strategy::kStream);
  EXPECT_EQ(*got, *ref);
  ASSERT_TRUE(load_all(files, plain).ok());  // O_DIRECT left the cache cold: fill it
  auto hot = load_all(files, o, &stats);     // cached: views again
  ASSERT_TRUE(hot.ok());
  EXPECT_EQ(stats.strategy, Strategy::kLazy);
  EXPECT_EQ(*hot, *ref);
}

TEST(EngineOrder, OffsetNameAndListedOrders) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  // The writer lays out larger alignment first, then by name: offset order b (f32), then a, c (u8).
  Tensor u8 = *Tensor::empty(DType::U8, {4});
  std::memset(u8.mutable_bytes().data(), 1, 4);
  Tensor u8c = *Tensor::empty(DType::U8, {2});
  std::memset(u8c.mutable_bytes().data(), 2, 2);
  write_st(p, {{"c", std::move(u8c)}, {"b", make_f32({2}, 1)}, {"a", std::move(u8)}});
  auto names = [&](LoadOptions::Order order, Strategy s) {
    LoadOptions o;
    o.strategy = s;
    o.order = order;
    o.file_views = true;
    std::vector<std::string> out;
    EXPECT_TRUE(load_files({p}, o, [&](LoadedTensor&& t) {
                  out.push_back(t.name);
                  return Status();
                }).ok());
    return out;
  };
  using V = std::vector<std::string>;
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    EXPECT_EQ(names(LoadOptions::Order::kOffset, s), (V{"b", "a", "c"}));
    EXPECT_EQ(names(LoadOptions::Order::kName, s), (V{"a", "b", "c"}));
    EXPECT_EQ(names(LoadOptions::Order::kListed, s), (V{"b", "a", "c"}));  // safetensors lists in offset order
  }
}

TEST(EngineSelect, OnlySelectedTensorsAreRead) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  write_st(p, {{"keep", make_f32({16}, 1)}, {"drop", make_f32({1 << 16}, 2)}});
  testing::CountingEnv env;
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.direct = Toggle::kOff;
  o.env = &env;
  o.select = [](std::string_view n) { return n == "keep"; };
  LoadStats stats;
  auto got = load_all({p}, o, &stats);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(got->size(), 1u);
  EXPECT_EQ(got->count("keep"), 1u);
  uint64_t data = 0;
  for (auto& r : env.reads()) data += r.len;
  EXPECT_LT(data, 4096u);  // the header and 64 bytes, never drop's 256 KiB
}

}  // namespace
}  // namespace wl

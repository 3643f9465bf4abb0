// Write faults through the Env seam: every writer (safetensors, .npy, the
// NumPy cache, conversion) reports a failed write naming its output and
// leaves neither a half-written file nor a stray temporary behind.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>

#include "engine_test_util.h"
#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/convert.h"
#include "weightlift/np_cache.h"
#include "weightlift/npy.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::make_f32;
using testing::TempDir;

// Files created through it accept `budget` bytes in all, then fail every
// write with ENOSPC; everything else goes to the default Env.
struct DiskFullEnv : testing::FaultInjectionEnv {
  explicit DiskFullEnv(uint64_t budget) { add_write({.enospc_after_bytes = budget}); }
};

TEST(FaultWrite, SafetensorsAndNpyWritersLeaveNothingOnAFullDisk) {
  TempDir dir;
  Tensor t = make_f32({1024}, 1);
  std::vector<NamedTensor> ts = {{"a", t.view()}};
  for (uint64_t budget : {0ull, 100ull, 2000ull}) {
    DiskFullEnv env(budget);
    Status s = write_safetensors(dir.file("out.safetensors"), ts, {}, &env);
    ASSERT_FALSE(s.ok()) << budget;
    EXPECT_EQ(s.code(), Code::kIoError);
    EXPECT_EQ(s.file(), dir.file("out.safetensors"));
    EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.to_string();
    DiskFullEnv env2(budget);
    Status n = write_npy(dir.file("out.npy"), t.view(), &env2);
    ASSERT_FALSE(n.ok());
    EXPECT_EQ(n.file(), dir.file("out.npy"));
    EXPECT_TRUE(testing::list_dir(dir.path()).empty()) << "budget " << budget;
  }
  DiskFullEnv roomy(1 << 20);
  ASSERT_TRUE(write_safetensors(dir.file("out.safetensors"), ts, {}, &roomy).ok());
}

TEST(FaultWrite, SafetensorsWriterGathersSmallTensorsAndSyncsOnlyWhenAsked) {
  TempDir dir;
  std::vector<Tensor> owned;
  std::vector<NamedTensor> ts;
  for (int i = 0; i < 3000; ++i) {
    owned.push_back(make_f32({16 + i % 7}, i));
    ts.push_back({"small." + std::to_string(i), owned.back().view()});
  }
  owned.push_back(make_f32({600 * 1024}, 9));  // 2.4 MB: written from its own memory
  ts.push_back({"large", owned.back().view()});
  auto expect = serialize_safetensors(ts);
  ASSERT_TRUE(expect.ok());
  for (bool sync : {true, false}) {
    testing::FaultInjectionEnv env;
    ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"), ts, {}, &env, sync).ok());
    EXPECT_EQ(testing::read_bytes(dir.file("m.safetensors")), *expect) << sync;
    EXPECT_LE(env.counters().writes.load(), 4u) << "3000 small tensors in a handful of writes";
    EXPECT_EQ(env.counters().syncs.load(), sync ? 1u : 0u);
    EXPECT_EQ(env.counters().renames.load(), 1u);
  }
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"m.safetensors"});
}

TEST(FaultWrite, ConversionAndNumpyCacheFailCleanly) {
  TempDir dir;
  const std::string bin = std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/state_dict.bin";
  DiskFullEnv env(64);
  auto r = convert_pytorch_to_safetensors(bin, dir.file("sub/model.safetensors"), {}, &env);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIoError) << r.status().to_string();
  EXPECT_EQ(r.status().file(), dir.file("sub/model.safetensors"));
  EXPECT_TRUE(testing::list_dir(dir.file("sub")).empty());

  testing::write_st(dir.file("m.safetensors"), {{"x", make_f32({4096}, 1)}, {"y", make_f32({8}, 2)}});
  DiskFullEnv env2(5000);  // the first tensor's file fits, the second's does not
  auto c = np_cache_prepare({dir.file("m.safetensors")}, dir.path(), dir.file("np.lock"), &env2);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kIoError) << c.status().to_string();
  // No names file: the cache is not marked complete, and no temporary is left.
  for (const auto& name : testing::list_dir(dir.file("np"))) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  EXPECT_FALSE(Env::Default()->exists(dir.file("np/" + std::string(kNpCacheNames))));
  auto ok = np_cache_prepare({dir.file("m.safetensors")}, dir.path(), dir.file("np.lock"));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(ok->dumped);
}

}  // namespace
}  // namespace wl

// `weightlift load`: every strategy prints the same checksums; flags are checked.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "test_util.h"
#include "weightlift/synth.h"

namespace wl {
namespace {

using testing::run_cli;
using testing::TempDir;

TEST(EngineCli, StrategiesPrintIdenticalChecksums) {
  TempDir dir;
  SynthOptions so;
  so.target_bytes = uint64_t{2} << 20;
  ASSERT_TRUE(synth_model(dir.path(), so).ok());
  auto ref = run_cli({"load", dir.path(), "--strategy", "lazy", "--checksum", "--format", "jsonl", "--no-progress"});
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  EXPECT_NE(ref.out.find("\"sha256\""), std::string::npos);
  EXPECT_NE(ref.err.find("peak RSS"), std::string::npos);
  for (const char* s : {"eager", "prefetch", "auto", "threads", "stream"}) {
    auto r = run_cli({"load", dir.path(), "--strategy", s, "--checksum", "--format", "jsonl", "--no-progress",
                      "--threads", "3", "--block-size", "64KiB"});
    ASSERT_EQ(r.exit_code, 0) << s << ": " << r.err;
    EXPECT_EQ(r.out, ref.out) << s;
  }
  auto direct = run_cli({"load", dir.path(), "--strategy", "stream", "--direct", "on", "--max-memory", "1MiB",
                         "--checksum", "--format", "jsonl", "--no-progress"});
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_EQ(direct.out, ref.out);
  // Into buffers allocated and touched before the load (the caller-destination path).
  for (const char* s : {"lazy", "threads", "stream"}) {
    auto into = run_cli({"load", dir.path(), "--strategy", s, "--into-preallocated", "--checksum", "--format", "jsonl",
                         "--no-progress", "--threads", "2"});
    ASSERT_EQ(into.exit_code, 0) << s << ": " << into.err;
    EXPECT_EQ(into.out, ref.out) << s;
  }
  auto bad = run_cli({"load", dir.path(), "--into-preallocated", "--tp-size", "2", "--shard-rule", "*:0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--into-preallocated loads whole tensors"), std::string::npos) << bad.err;
}

TEST(EngineCli, ProgressOnlyOnRankZeroAndOffWithFlag) {
  TempDir dir;
  SynthOptions so;
  so.target_bytes = uint64_t{1} << 20;
  ASSERT_TRUE(synth_model(dir.path(), so).ok());
  auto r0 = run_cli({"load", dir.path(), "--strategy", "stream"});
  ASSERT_EQ(r0.exit_code, 0) << r0.err;
  EXPECT_NE(r0.err.find("100% Completed"), std::string::npos) << r0.err;
  auto r1 = run_cli({"load", dir.path(), "--strategy", "stream", "--tp-rank", "1", "--tp-size", "2"});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_EQ(r1.err.find("Completed"), std::string::npos) << r1.err;
  auto off = run_cli({"load", dir.path(), "--no-progress"});
  EXPECT_EQ(off.err.find("Completed"), std::string::npos);
}

TEST(EngineCli, TensorParallelAndExperts) {
  TempDir dir;
  testing::write_st(dir.file("m.safetensors"), {{"l.experts.0.w.weight", testing::make_f32({4, 4}, 1)},
                                                {"l.experts.1.w.weight", testing::make_f32({4, 4}, 2)},
                                                {"l.q.weight", testing::make_f32({4, 6}, 3)}});
  auto r =
      run_cli({"load", dir.file("m.safetensors"), "--strategy", "stream", "--experts", "1", "--tp-rank", "1",
               "--tp-size", "2", "--shard-rule", "*.q.weight:1", "--checksum", "--format", "jsonl", "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("experts.0"), std::string::npos);
  EXPECT_NE(r.out.find("\"name\":\"l.q.weight\",\"dtype\":\"F32\",\"shape\":[4,3]"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("skipped 1 expert tensors"), std::string::npos) << r.err;
}

TEST(EngineCli, BadFlagsAreUsageErrors) {
  TempDir dir;
  testing::write_st(dir.file("m.safetensors"), {{"a", testing::make_f32({2}, 1)}});
  const std::vector<std::vector<std::string>> bad = {
      {"--strategy", "fast"},    {"--tp-rank", "2", "--tp-size", "2"},
      {"--shard-rule", "nodim"}, {"--experts", "3-1"},
      {"--max-memory", "lots"},  {"--threads", "-2"},
      {"--direct", "sometimes"}, {"--block-size", "0"},
  };
  for (auto& b : bad) {
    std::vector<std::string> args = {"load", dir.file("m.safetensors")};
    args.insert(args.end(), b.begin(), b.end());
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << b[0] << " " << r.err;
  }
  auto uneven = run_cli({"load", dir.file("m.safetensors"), "--tp-size", "3", "--shard-rule", "a:0"});
  EXPECT_EQ(uneven.exit_code, 1);
  EXPECT_NE(uneven.err.find("weightlift: error:"), std::string::npos);
  EXPECT_NE(uneven.err.find("does not divide into 3 shards"), std::string::npos) << uneven.err;
}

}  // namespace
}  // namespace wl

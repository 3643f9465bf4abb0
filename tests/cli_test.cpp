// End-to-end tests of the CLI contract: ls, load, synth; exit codes; messages.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"
#include "weightlift/hash.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::run_cli;
using testing::TempDir;

std::vector<nlohmann::json> jsonl(const std::string& s) {
  std::vector<nlohmann::json> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run_cli({"synth", dir_->file("m"), "--size", "TINY", "--seed", "3"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return dir_->file("m"); }
  static TempDir* dir_;
};
TempDir* CliTest::dir_ = nullptr;

TEST_F(CliTest, SynthWritesAShardedLlamaFolder) {
  auto files = testing::list_dir(model());
  EXPECT_NE(std::find(files.begin(), files.end(), "config.json"), files.end());
  EXPECT_NE(std::find(files.begin(), files.end(), "model.safetensors.index.json"), files.end());
  int shards = 0;
  for (auto& f : files) shards += f.find(".safetensors") != std::string::npos && f.find("index") == std::string::npos;
  EXPECT_GE(shards, 2);
  auto idx = nlohmann::json::parse(testing::read_bytes(model() + "/model.safetensors.index.json"));
  EXPECT_TRUE(idx["weight_map"].contains("model.embed_tokens.weight"));
  EXPECT_TRUE(idx["weight_map"].contains("model.layers.0.self_attn.q_proj.weight"));
  uint64_t total = 0;
  auto ls = jsonl(run_cli({"ls", model(), "--format", "jsonl"}).out);
  for (auto& t : ls) total += t["bytes"].get<uint64_t>();
  EXPECT_EQ(idx["metadata"]["total_size"].get<uint64_t>(), total);
  // BF16 weights, F32 norms.
  for (auto& t : ls) {
    std::string name = t["name"];
    EXPECT_EQ(t["dtype"], name.find("norm") != std::string::npos ? "F32" : "BF16") << name;
  }
}

TEST_F(CliTest, SynthIsDeterministic) {
  TempDir other;
  ASSERT_EQ(run_cli({"synth", other.file("m"), "--size", "TINY", "--seed", "3"}).exit_code, 0);
  for (auto& f : testing::list_dir(model()))
    EXPECT_EQ(testing::read_bytes(model() + "/" + f), testing::read_bytes(other.file("m") + "/" + f)) << f;
}

TEST_F(CliTest, LsListsEveryTensorWithItsPlace) {
  auto r = run_cli({"ls", model(), "--format", "jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto rows = jsonl(r.out);
  ASSERT_FALSE(rows.empty());
  for (auto& row : rows) {
    for (const char* k : {"name", "dtype", "shape", "file", "offset", "bytes"}) EXPECT_TRUE(row.contains(k)) << k;
    auto f = SafetensorsFile::open(row["file"].get<std::string>());
    ASSERT_TRUE(f.ok());
    auto* info = (*f)->find(row["name"].get<std::string>());
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(row["offset"].get<uint64_t>(), info->offset);
  }
  auto table = run_cli({"ls", model()});
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.out.find("NAME"), std::string::npos);
  EXPECT_NE(table.out.find("model.embed_tokens.weight"), std::string::npos);
}

TEST_F(CliTest, LoadChecksumsMatchTheFileBytesForEveryStrategy) {
  std::map<std::string, std::string> expected;
  auto ls = jsonl(run_cli({"ls", model(), "--format", "jsonl"}).out);
  for (auto& row : ls) {
    auto f = SafetensorsFile::open(row["file"].get<std::string>());
    auto v = (*f)->get(row["name"].get<std::string>());
    expected[row["name"]] = sha256_hex(v->bytes());
  }
  for (const char* strategy : {"lazy", "eager"}) {
    auto r = run_cli({"load", model(), "--strategy", strategy, "--checksum", "--format", "jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto rows = jsonl(r.out);
    ASSERT_EQ(rows.size(), expected.size()) << strategy;
    for (auto& row : rows) {
      EXPECT_EQ(row.size(), 4u);
      EXPECT_EQ(row["sha256"].get<std::string>(), expected[row["name"]]) << row["name"];
      EXPECT_TRUE(row["shape"].is_array());
    }
    // Summary on stderr: tensors, bytes, seconds, GB/s, peak RSS.
    EXPECT_NE(r.err.find("loaded"), std::string::npos);
    EXPECT_NE(r.err.find("GB/s"), std::string::npos);
    EXPECT_NE(r.err.find("peak RSS"), std::string::npos);
    EXPECT_NE(r.err.find("% Completed"), std::string::npos);
  }
  auto quiet = run_cli({"load", model(), "--no-progress"});
  EXPECT_EQ(quiet.err.find("% Completed"), std::string::npos);
}

TEST_F(CliTest, LoadASingleShardFile) {
  auto files = testing::list_dir(model());
  std::string shard = model() + "/" + files[1];  // model-00001-of-...
  ASSERT_NE(shard.find("model-00001"), std::string::npos);
  auto r = run_cli({"load", shard, "--checksum", "--format", "jsonl"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST(CliErrors, MalformedFileIsExitOneWithFileAndReason) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  testing::write_bytes(
      path, testing::st_prefix(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})") + std::string(8, '\0'));
  for (const char* cmd : {"ls", "load"}) {
    auto r = run_cli({cmd, path});
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_EQ(r.err.rfind("weightlift: error: " + path + ": tensor 'w': ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("needs 12"), std::string::npos) << r.err;
  }
}

TEST(CliErrors, TruncatedShardInAFolderIsNamed) {
  TempDir dir;
  ASSERT_EQ(run_cli({"synth", dir.file("m"), "--size", "TINY"}).exit_code, 0);
  auto files = testing::list_dir(dir.file("m"));
  std::string shard = dir.file("m/" + files[2]);  // config.json, model-00001-..., model-00002-...
  ASSERT_NE(shard.find("model-00002-of-"), std::string::npos);
  std::string bytes = testing::read_bytes(shard);
  ASSERT_FALSE(bytes.empty());
  testing::write_bytes(shard, bytes.substr(0, bytes.size() - 100));
  auto r = run_cli({"load", dir.file("m")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(shard), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data area ends at byte"), std::string::npos) << r.err;
}

TEST(CliErrors, MissingPathsAndIndexEntries) {
  auto r = run_cli({"load", "/no/such/model"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/no/such/model"), std::string::npos);
  TempDir dir;
  ASSERT_EQ(run_cli({"synth", dir.file("m"), "--size", "TINY"}).exit_code, 0);
  std::string first = testing::list_dir(dir.file("m"))[1];
  ASSERT_EQ(first.rfind("model-00001-of-", 0), 0u);
  ::unlink(dir.file("m/" + first).c_str());
  auto r2 = run_cli({"ls", dir.file("m")});
  EXPECT_EQ(r2.exit_code, 1);
  EXPECT_NE(r2.err.find("index names " + first + " which does not exist"), std::string::npos) << r2.err;
  TempDir empty;
  auto r3 = run_cli({"load", empty.path()});
  EXPECT_EQ(r3.exit_code, 1);
  EXPECT_NE(r3.err.find("no *.safetensors"), std::string::npos) << r3.err;
}

TEST(CliErrors, UsageErrorsExitTwo) {
  EXPECT_EQ(run_cli({}).exit_code, 2);
  EXPECT_EQ(run_cli({"load"}).exit_code, 2);
  EXPECT_EQ(run_cli({"frobnicate"}).exit_code, 2);
  EXPECT_EQ(run_cli({"ls", "x", "--format", "xml"}).exit_code, 2);
  auto r = run_cli({"synth", "/tmp/x", "--size", "lots"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("invalid size"), std::string::npos);
  EXPECT_EQ(run_cli({"--help"}).exit_code, 0);
}

TEST(CliErrors, HostileHeaderDoesNotAllocateOrCrash) {
  TempDir dir;
  std::string path = dir.file("huge.safetensors");
  std::string s(8, '\0');
  uint64_t n = 99'999'999;  // under the cap but far past the file's end
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  testing::write_bytes(path, s + "{}");
  auto r = run_cli({"load", path});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("past the end of the file"), std::string::npos);
}

}  // namespace
}  // namespace wl

namespace wl {
namespace {
TEST(CliDummy, LoadDummyIsDeterministicAcrossThreadCountsAndNotTheFileBytes) {
  TempDir dir;
  ASSERT_EQ(run_cli({"synth", dir.file("m"), "--size", "TINY"}).exit_code, 0);
  auto one = run_cli({"load", dir.file("m"), "--dummy", "--checksum", "--format", "jsonl", "--threads", "1"});
  auto two = run_cli({"load", dir.file("m"), "--dummy", "--checksum", "--format", "jsonl", "--threads", "2"});
  auto real = run_cli({"load", dir.file("m"), "--checksum", "--format", "jsonl"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  EXPECT_EQ(one.out, two.out);
  EXPECT_NE(one.out, real.out);
  EXPECT_EQ(jsonl(one.out).size(), jsonl(real.out).size());
  EXPECT_NE(one.err.find("strategy dummy"), std::string::npos) << one.err;
  auto seeded = run_cli({"load", dir.file("m"), "--dummy", "--dummy-seed", "7", "--checksum", "--format", "jsonl"});
  EXPECT_NE(seeded.out, one.out);
}
}  // namespace
}  // namespace wl

// `weightlift ls` and `weightlift load` on PyTorch checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace wl {
namespace {

namespace fs = std::filesystem;
std::string fixture(const std::string& name) {
  return std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + name;
}
nlohmann::json expected(const std::string& file) {
  std::ifstream in(fixture("expected.json"));
  return nlohmann::json::parse(in)[file];
}

std::vector<nlohmann::json> jsonl(const std::string& out) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(TorchCli, LsListsBinAndPtFiles) {
  for (std::string f : {"views.bin", "dtypes.pt", "legacy.bin", "zip64.pt"}) {
    auto r = testing::run_cli({"ls", "--format", "jsonl", fixture(f)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto rows = jsonl(r.out);
    auto ex = expected(f);
    ASSERT_EQ(rows.size(), ex.size()) << f;
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i]["name"], ex[i]["name"]);
      EXPECT_EQ(rows[i]["dtype"], ex[i]["dtype"]);
      EXPECT_EQ(rows[i]["shape"], ex[i]["shape"]);
      EXPECT_EQ(rows[i]["offset"].is_null(), !ex[i]["contiguous"].get<bool>()) << rows[i].dump();
    }
  }
}

TEST(TorchCli, LsListsAFolderOfBinShards) {
  testing::TempDir dir;
  fs::copy_file(fixture("state_dict.bin"), dir.file("pytorch_model-00001-of-00002.bin"));
  fs::copy_file(fixture("params.pt"), dir.file("pytorch_model-00002-of-00002.bin"));
  auto r = testing::run_cli({"ls", "--format", "jsonl", dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(jsonl(r.out).size(), 6u);
}

TEST(TorchCli, HostileFilesFailNamingTheFile) {
  for (std::string f :
       {"evil_system.pt", "evil_eval.pt", "truncated.bin", "random.bin", "short_storage.pt", "huge_storage.pt"}) {
    auto r = testing::run_cli({"ls", fixture(f)});
    EXPECT_EQ(r.exit_code, 1) << f;
    EXPECT_EQ(r.err.rfind("weightlift: error: " + fixture(f) + ": ", 0), 0u) << r.err;
  }
}

TEST(TorchCli, LoadChecksumsMatchTorch) {
  for (std::string f : {"views.bin", "legacy.bin", "bigendian.pt", "state_dict.bin"}) {
    auto r = testing::run_cli({"load", "--checksum", "--format", "jsonl", fixture(f)});
    if (r.exit_code != 0 && r.err.find("safetensors") != std::string::npos)
      GTEST_SKIP() << "weightlift load does not route PyTorch files yet: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto rows = jsonl(r.out);
    auto ex = expected(f);
    std::map<std::string, std::string> want;
    for (auto& e : ex) want[e["name"]] = e["sha256"];
    size_t matched = 0;
    for (auto& row : rows) {
      if (!row.contains("sha256") || !row.contains("name")) continue;
      EXPECT_EQ(row["sha256"].get<std::string>(), want.at(row["name"].get<std::string>())) << f << " " << row.dump();
      ++matched;
    }
    EXPECT_EQ(matched, ex.size()) << f;
  }
}

}  // namespace
}  // namespace wl

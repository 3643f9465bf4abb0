// weightlift convert: PyTorch checkpoints to safetensors (library and CLI).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "weightlift/convert.h"
#include "weightlift/hash.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + name;
}
nlohmann::json expected(const std::string& file) {
  std::ifstream in(fixture("expected.json"));
  return nlohmann::json::parse(in)[file];
}

TEST(ConvertPytorch, ViewsRoundTripAndTiedNamesAreDropped) {
  TempDir dir;
  std::string out = dir.file("sub/model.safetensors");
  auto r = convert_pytorch_to_safetensors(fixture("views.bin"), out);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // The reference drops names whose data_ptr() equals an earlier one: the tied head and the transpose.
  EXPECT_EQ(r->dropped, (std::vector<std::string>{"lm_head.weight", "base_t"}));
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->get()->metadata().at("format"), "pt");
  size_t checked = 0;
  for (auto& e : expected("views.bin")) {
    std::string name = e["name"];
    const TensorInfo* t = (*f)->find(name);
    if (name == "lm_head.weight" || name == "base_t") {
      EXPECT_EQ(t, nullptr) << name;
      continue;
    }
    ASSERT_NE(t, nullptr) << name;
    auto v = (*f)->get(name);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(sha256_hex(v->bytes()), e["sha256"].get<std::string>()) << name;
    EXPECT_EQ(v->shape(), e["shape"].get<Shape>());
    ++checked;
  }
  EXPECT_EQ(checked, 9u);
}

TEST(ConvertPytorch, UnwrapsStateDictAndReadsLegacy) {
  TempDir dir;
  auto r = convert_pytorch_to_safetensors(fixture("wrapped.bin"), dir.file("w.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto f = SafetensorsFile::open(dir.file("w.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"b", "w"}));
  r = convert_pytorch_to_safetensors(fixture("legacy.bin"), dir.file("l.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors, 9u);
}

TEST(ConvertPytorch, FolderWritesEveryShardAndAnIndex) {
  TempDir dir;
  fs::copy_file(fixture("state_dict.bin"), dir.file("pytorch_model-00001-of-00002.bin"));
  fs::copy_file(fixture("params.pt"), dir.file("pytorch_model-00002-of-00002.bin"));
  fs::copy_file(fixture("params.pt"), dir.file("training_args.bin"));  // not weights: ignored
  auto r = convert_pytorch_folder(dir.path(), dir.file("out"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(testing::list_dir(dir.file("out")),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                      "model.safetensors.index.json"}));
  auto index = nlohmann::json::parse(testing::read_bytes(dir.file("out/model.safetensors.index.json")));
  EXPECT_EQ(index["weight_map"]["0.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["frozen"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 6u);
  EXPECT_EQ(index["metadata"]["total_size"], 48 + 12 * 3 + 16 + 12);
  EXPECT_EQ(safetensors_name_for("pytorch_model.bin"), "model.safetensors");
  EXPECT_EQ(safetensors_name_for("consolidated.pt"), "consolidated.safetensors");
}

TEST(ConvertPytorch, FailuresLeaveNoOutput) {
  TempDir dir;
  // complex128 cannot be stored in safetensors: the error names the tensor.
  auto r = convert_pytorch_to_safetensors(fixture("dtypes.pt"), dir.file("d.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().tensor(), "t_c128");
  EXPECT_NE(r.status().to_string().find("C128"), std::string::npos) << r.status().to_string();
  // A hostile input.
  r = convert_pytorch_to_safetensors(fixture("evil_system.pt"), dir.file("e.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("posix.system"), std::string::npos);
  // The size check (forced with a negative allowance).
  r = convert_pytorch_to_safetensors(fixture("params.pt"), dir.file("p.safetensors"), {.max_size_growth = -0.99});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("refusing to write it"), std::string::npos) << r.status().to_string();
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{});
}

TEST(ConvertPytorch, Cli) {
  TempDir dir;
  fs::copy_file(fixture("views.bin"), dir.file("pytorch_model.bin"));
  auto r = testing::run_cli({"convert", dir.file("pytorch_model.bin")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dir.file("model.safetensors") + "\n");
  EXPECT_NE(r.err.find("dropped 2 names"), std::string::npos) << r.err;
  r = testing::run_cli({"convert", fixture("evil_eval.pt"), dir.file("x.safetensors")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("weightlift: error: "), std::string::npos);
  EXPECT_NE(r.err.find("evil_eval.pt"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("builtins.eval"), std::string::npos) << r.err;
  r = testing::run_cli({"convert", dir.file("missing.bin")});
  EXPECT_EQ(r.exit_code, 1);
  // A folder: shards + index beside the input.
  TempDir model;
  fs::copy_file(fixture("state_dict.bin"), model.file("pytorch_model.bin"));
  r = testing::run_cli({"convert", model.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(model.file("model.safetensors")));
  EXPECT_TRUE(fs::exists(model.file("model.safetensors.index.json")));
}

}  // namespace
}  // namespace wl

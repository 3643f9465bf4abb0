// File selection as the reference does it.
#include <gtest/gtest.h>

#include "test_util.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::TempDir;
using testing::write_bytes;

std::vector<std::string> names(const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  for (auto& p : paths) out.push_back(p.substr(p.rfind('/') + 1));
  return out;
}

TEST(WeightFiles, NaturalOrder) {
  std::vector<std::string> v = {"/d/model-10-of-10.safetensors", "/d/model-2-of-10.safetensors",
                                "/d/model-1-of-10.safetensors", "/d/model-002-of-10.safetensors"};
  natural_sort(v);
  EXPECT_EQ(names(v), (std::vector<std::string>{"model-1-of-10.safetensors", "model-2-of-10.safetensors",
                                                "model-002-of-10.safetensors", "model-10-of-10.safetensors"}));
  EXPECT_TRUE(natural_less("a9", "a10"));
  EXPECT_FALSE(natural_less("a10", "a9"));
  EXPECT_TRUE(natural_less("a", "ab"));
  EXPECT_TRUE(natural_less("x99999999999999999999999", "x100000000000000000000000"));
}

TEST(WeightFiles, NaturalOrderIsByWhatFollowsTheLastSlash) {
  // As the reference's os.path.basename: "" for a trailing slash (found by fuzz_weight_index).
  std::vector<std::string> v = {"/a/x10", "/b/c9/", "/a/x2"};
  natural_sort(v);
  EXPECT_EQ(v, (std::vector<std::string>{"/b/c9/", "/a/x2", "/a/x10"}));
}

TEST(WeightFiles, NaturalKeyIsPythonsSplit) {
  using V = std::vector<std::string>;
  EXPECT_EQ(natural_key("model-00001-of-00005.safetensors"), (V{"model-", "00001", "-of-", "00005", ".safetensors"}));
  EXPECT_EQ(natural_key("10.safetensors"), (V{"", "10", ".safetensors"}));
  EXPECT_EQ(natural_key("m-10"), (V{"m-", "10", ""}));
  EXPECT_EQ(natural_key("model.safetensors"), (V{"model.safetensors"}));
  EXPECT_EQ(natural_key(""), (V{""}));
}

TEST(WeightFiles, SafetensorsFirstThenBinThenPt) {
  TempDir dir;
  write_bytes(dir.file("a.pt"), "x");
  auto wf = find_weight_files(dir.path());
  ASSERT_TRUE(wf.ok());
  EXPECT_EQ(names(wf->files), (std::vector<std::string>{"a.pt"}));
  EXPECT_EQ(wf->format, WeightFormat::kPytorch);
  write_bytes(dir.file("pytorch_model-2.bin"), "x");
  write_bytes(dir.file("pytorch_model-10.bin"), "x");
  write_bytes(dir.file("training_args.bin"), "x");
  wf = find_weight_files(dir.path());
  EXPECT_EQ(names(wf->files), (std::vector<std::string>{"pytorch_model-2.bin", "pytorch_model-10.bin"}));
  write_bytes(dir.file("model.safetensors"), "x");
  wf = find_weight_files(dir.path());
  EXPECT_EQ(names(wf->files), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(wf->format, WeightFormat::kSafetensors);
}

TEST(WeightFiles, TrainingFilesAreDropped) {
  auto kept = filter_files_not_needed_for_inference({"/m/training_args.bin", "/m/optimizer.bin", "/m/optimizer.pt",
                                                     "/m/scheduler.pt", "/m/scaler.pt", "/m/model.bin"});
  EXPECT_EQ(kept, (std::vector<std::string>{"/m/model.bin"}));
  TempDir dir;
  write_bytes(dir.file("optimizer.pt"), "x");
  write_bytes(dir.file("scheduler.pt"), "x");
  auto wf = find_weight_files(dir.path());
  ASSERT_FALSE(wf.ok());
  EXPECT_EQ(wf.status().code(), Code::kNotFound);
  EXPECT_NE(wf.status().to_string().find("no *.safetensors, *.bin or *.pt"), std::string::npos);
}

TEST(WeightFiles, IndexDropsConsolidatedFile) {
  TempDir dir;
  write_bytes(dir.file("model-00001-of-00002.safetensors"), "x");
  write_bytes(dir.file("model-00002-of-00002.safetensors"), "x");
  write_bytes(dir.file("consolidated.safetensors"), "x");
  write_bytes(
      dir.file("model.safetensors.index.json"),
      R"({"metadata":{},"weight_map":{"a":"model-00002-of-00002.safetensors","b":"model-00001-of-00002.safetensors"}})");
  auto wf = find_weight_files(dir.path());
  ASSERT_TRUE(wf.ok()) << wf.status().to_string();
  EXPECT_EQ(names(wf->files),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
}

TEST(WeightFiles, IndexErrors) {
  TempDir dir;
  write_bytes(dir.file("model-00001-of-00002.safetensors"), "x");
  write_bytes(dir.file("model.safetensors.index.json"),
              R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  auto wf = find_weight_files(dir.path());
  ASSERT_FALSE(wf.ok());
  EXPECT_EQ(wf.status().code(), Code::kNotFound);
  EXPECT_NE(wf.status().to_string().find("model-00002-of-00002.safetensors which does not exist"), std::string::npos);
  EXPECT_NE(wf.status().file().find("model.safetensors.index.json"), std::string::npos);
  const char* bad[] = {"[1]", "{}", R"({"weight_map":{"a":1}})", R"({"weight_map":{"a":"../x.safetensors"}})", "{"};
  for (const char* text : bad) {
    write_bytes(dir.file("model.safetensors.index.json"), text);
    auto r = find_weight_files(dir.path());
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kCorruptData) << text;
  }
  write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map":{}})");
  auto none = find_weight_files(dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("names none of the"), std::string::npos);
}

// An index that repeats a key (a tensor mapped to two shards, weight_map
// twice) means two things to two readers: refused, naming the key.
TEST(WeightFiles, AnIndexThatRepeatsAKeyIsRefused) {
  TempDir dir;
  write_bytes(dir.file("model-00001-of-00002.safetensors"), "x");
  write_bytes(dir.file("model-00002-of-00002.safetensors"), "x");
  write_bytes(dir.file("consolidated.safetensors"), "x");
  for (const char* text :
       {R"({"weight_map":{"a":"model-00001-of-00002.safetensors","a":"model-00002-of-00002.safetensors"}})",
        R"({"weight_map":{"a":"consolidated.safetensors"},"weight_map":{"a":"model-00001-of-00002.safetensors"}})",
        R"({"metadata":{"total_size":1,"total_size":2},"weight_map":{"a":"model-00001-of-00002.safetensors"}})"}) {
    write_bytes(dir.file("model.safetensors.index.json"), text);
    auto r = find_weight_files(dir.path());
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), Code::kCorruptData) << text;
    EXPECT_NE(r.status().message().find("duplicate key"), std::string::npos) << r.status().to_string();
    EXPECT_NE(r.status().file().find("model.safetensors.index.json"), std::string::npos);
  }
}

TEST(WeightFiles, SingleFileAndMissingPath) {
  TempDir dir;
  write_bytes(dir.file("w.bin"), "x");
  auto wf = find_weight_files(dir.file("w.bin"));
  ASSERT_TRUE(wf.ok());
  EXPECT_EQ(wf->format, WeightFormat::kPytorch);
  auto missing = find_weight_files(dir.file("nope"));
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().file().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace wl

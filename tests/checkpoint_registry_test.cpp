// The format registry (checkpoint.h): every format's record is whole and
// claims its own extensions and magic alone, and open_checkpoint() reaches
// each format through it, by extension, by magic, and (safetensors) as the
// fallback for a file that neither names.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "test_util.h"
#include "weightlift/checkpoint.h"
#include "weightlift/npy.h"
#include "weightlift/safetensors.h"
#include "weightlift/torch.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::TempDir;

std::string fixture(const std::string& name) {
  return std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + name;
}

std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(CheckpointRegistry, ListsEveryFormatOnceWithAWholeRecord) {
  std::set<std::string_view> names;
  std::set<WeightFormat> ids;
  for (const CheckpointFormat* f : checkpoint_formats()) {
    ASSERT_NE(f, nullptr);
    SCOPED_TRACE(f->name);
    EXPECT_FALSE(f->name.empty());
    EXPECT_TRUE(names.insert(f->name).second) << "two records named " << f->name;
    EXPECT_TRUE(ids.insert(f->id).second) << "two records with one WeightFormat";
    EXPECT_NE(f->open, nullptr);
    EXPECT_FALSE(f->extensions.empty());
    for (std::string_view ext : f->extensions) EXPECT_TRUE(ext.size() > 1 && ext[0] == '.') << ext;
    for (std::string_view magic : f->magics) {
      EXPECT_FALSE(magic.empty());
      EXPECT_LE(magic.size(), kCheckpointMagicBytes) << "open_checkpoint compares only the first bytes";
    }
  }
  EXPECT_EQ(names, (std::set<std::string_view>{"safetensors", "pytorch", "numpy"}));
}

TEST(CheckpointRegistry, NoTwoFormatsClaimOneNameOrOneMagic) {
  auto formats = checkpoint_formats();
  for (const CheckpointFormat* a : formats)
    for (const CheckpointFormat* b : formats) {
      if (a == b) continue;
      for (std::string_view ext : a->extensions)
        EXPECT_FALSE(b->claims_name("model" + std::string(ext))) << b->name << " claims " << a->name << "'s " << ext;
      for (std::string_view magic : a->magics) {
        std::string head(magic);
        head.resize(kCheckpointMagicBytes, '\0');
        EXPECT_FALSE(b->claims_head(bytes_of(head))) << b->name << " claims " << a->name << "'s magic";
      }
    }
}

TEST(CheckpointRegistry, FindsTheFormatByExtensionAndByMagic) {
  for (const CheckpointFormat* f : checkpoint_formats()) {
    SCOPED_TRACE(f->name);
    for (std::string_view ext : f->extensions) {
      EXPECT_EQ(checkpoint_format_for_name("/m/model-00001-of-00002" + std::string(ext)), f);
      EXPECT_EQ(checkpoint_format_for_name(std::string(ext)), f);  // the whole name
    }
    for (std::string_view magic : f->magics) {
      std::string head(magic);
      head.resize(kCheckpointMagicBytes, 'x');
      EXPECT_EQ(checkpoint_format_for_head(bytes_of(head)), f);
      EXPECT_EQ(checkpoint_format_for_head(bytes_of(magic.substr(0, magic.size() - 1))), nullptr) << "a cut magic";
    }
  }
  // Exact endings only, as before the registry: no case folding, no partial extension.
  for (const char* name : {"model.BIN", "model.safetensors.index.json", "model.np", "model.bin.tmp", "model", ""})
    EXPECT_EQ(checkpoint_format_for_name(name), nullptr) << name;
  EXPECT_EQ(checkpoint_format_for_name("/data/pytorch_model.bin")->name, "pytorch");
  EXPECT_EQ(checkpoint_format_for_name("a.pth")->name, "pytorch");
  EXPECT_EQ(checkpoint_format_for_name("a.pt")->name, "pytorch");
  EXPECT_EQ(checkpoint_format_for_name("a.npy")->name, "numpy");
  EXPECT_EQ(checkpoint_format_for_head(bytes_of("\x93NUMPY\x01\x00"))->name, "numpy");
  EXPECT_EQ(checkpoint_format_for_head(bytes_of("PK\x03\x04....."))->name, "pytorch");
  EXPECT_EQ(checkpoint_format_for_head(bytes_of("\x80\x02\x8a\x0a"
                                                "l...."))
                ->name,
            "pytorch");                                                                            // legacy
  EXPECT_EQ(checkpoint_format_for_head(bytes_of(std::string("\x10\0\0\0\0\0\0\0", 8))), nullptr);  // safetensors
  EXPECT_EQ(checkpoint_format_for_head({}), nullptr);
}

// One file of each format, opened under its own name and under a name that
// no format claims: the reader is the format's either way.
TEST(CheckpointRegistry, OpenCheckpointReachesEveryFormat) {
  TempDir dir;
  std::vector<float> xs = {1, 2, 3, 4, 5, 6};
  TensorView v(DType::F32, {2, 3}, std::as_bytes(std::span(xs)), nullptr);
  std::vector<NamedTensor> st = {{"w", v}};
  ASSERT_TRUE(write_safetensors(dir.file("m.safetensors"), st).ok());
  const std::pair<std::string, std::string> files[] = {
      {dir.file("m.safetensors"), "safetensors"},
      {fixture("state_dict.bin"), "pytorch"},  // zip
      {fixture("legacy.bin"), "pytorch"},      // the legacy stream
      {fixture("npy/v1_f32.npy"), "numpy"},
  };
  std::set<std::string> reached;
  for (const auto& [path, format] : files) {
    SCOPED_TRACE(path);
    auto by_name = open_checkpoint(path);
    ASSERT_TRUE(by_name.ok()) << by_name.status().to_string();
    EXPECT_EQ((*by_name)->format_name(), format);
    EXPECT_EQ(checkpoint_format_for_name(path)->name, format);

    std::string unnamed = dir.file("weights-" + std::to_string(reached.size()) + ".data");
    testing::write_bytes(unnamed, testing::read_bytes(path));
    auto by_magic = open_checkpoint(unnamed);
    ASSERT_TRUE(by_magic.ok()) << by_magic.status().to_string();
    EXPECT_EQ((*by_magic)->format_name(), format);
    ASSERT_EQ((*by_magic)->tensors().size(), (*by_name)->tensors().size());
    for (size_t i = 0; i < (*by_name)->tensors().size(); ++i) {
      auto a = (*by_name)->read(i), b = (*by_magic)->read(i);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_TRUE(std::ranges::equal(a->bytes(), b->bytes())) << (*by_name)->tensors()[i].name;
    }
    reached.insert(format);
  }
  std::set<std::string> all;
  for (const CheckpointFormat* f : checkpoint_formats()) all.insert(std::string(f->name));
  EXPECT_EQ(reached, all) << "a format without a file in this test";
}

// A file shorter than the magic bytes, under a name no format claims, is read
// as safetensors (and refused as one), whatever its first bytes.
TEST(CheckpointRegistry, AShortUnnamedFileIsReadAsSafetensors) {
  TempDir dir;
  for (std::string_view head :
       {std::string_view("PK\x03\x04"), std::string_view("\x93NUMPY"), std::string_view("\x80")}) {
    testing::write_bytes(dir.file("short"), head);
    auto ck = open_checkpoint(dir.file("short"));
    ASSERT_FALSE(ck.ok());
    EXPECT_EQ(ck.status().file(), dir.file("short"));
    EXPECT_NE(ck.status().message().find("too small for a safetensors header"), std::string::npos)
        << ck.status().to_string();
  }
}

// find_weight_files asks the registry for a single file's format.
TEST(CheckpointRegistry, WeightFilesTakeASingleFilesFormatFromTheRegistry) {
  for (const CheckpointFormat* f : checkpoint_formats())
    for (std::string_view ext : f->extensions) {
      TempDir dir;
      std::string path = dir.file("w" + std::string(ext));
      testing::write_bytes(path, "x");
      auto wf = find_weight_files(path);
      ASSERT_TRUE(wf.ok()) << wf.status().to_string();
      EXPECT_EQ(wf->format, f->id) << path;
    }
  TempDir dir;
  testing::write_bytes(dir.file("w.data"), "x");
  auto wf = find_weight_files(dir.file("w.data"));
  ASSERT_TRUE(wf.ok());
  EXPECT_EQ(wf->format, WeightFormat::kSafetensors);
}

}  // namespace
}  // namespace wl

// NumPy .npy reading/writing (fixtures written by numpy) and the NumPy weight cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "weightlift/checkpoint.h"
#include "weightlift/hash.h"
#include "weightlift/np_cache.h"
#include "weightlift/npy.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

std::string fixture(const std::string& name) {
  return std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + name;
}
nlohmann::json expected() {
  std::ifstream in(fixture("expected.json"));
  return nlohmann::json::parse(in);
}

TEST(Npy, ReadsEveryVersionOrderAndByteOrder) {
  size_t n = 0;
  const nlohmann::json all = expected();
  for (auto& [key, e] : all.items()) {
    if (key.rfind("npy/", 0) != 0) continue;
    SCOPED_TRACE(key);
    auto ck = open_checkpoint(fixture(key));
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    EXPECT_EQ((*ck)->format_name(), "numpy");
    ASSERT_EQ((*ck)->tensors().size(), 1u);
    const auto& t = (*ck)->tensors()[0];
    EXPECT_EQ(dtype_name(t.dtype), e["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<Shape>());
    auto v = (*ck)->view(0);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(sha256_hex(v->bytes()), e["sha256"].get<std::string>());
    auto r = read_npy(fixture(key));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(sha256_hex(r->bytes()), e["sha256"].get<std::string>());
    ++n;
  }
  EXPECT_EQ(n, 10u);
}

TEST(Npy, RefusesBrokenFilesNamingThem) {
  struct Case {
    const char* file;
    const char* error;
  };
  for (auto c : {Case{"npy/bad_truncated.npy", "truncated"}, Case{"npy/bad_magic.npy", "magic"},
                 Case{"npy/bad_overflow_shape.npy", "overflows"}, Case{"npy/bad_huge_shape.npy", "needs 4000000000000"},
                 Case{"npy/bad_header_len.npy", "runs past the end"}, Case{"npy/bad_structured.npy", "structured"}}) {
    auto ck = open_checkpoint(fixture(c.file));
    ASSERT_FALSE(ck.ok()) << c.file;
    EXPECT_EQ(ck.status().file(), fixture(c.file));
    EXPECT_NE(ck.status().message().find(c.error), std::string::npos) << ck.status().to_string();
    EXPECT_FALSE(read_npy(fixture(c.file)).ok());
  }
  // Header fragments.
  for (std::string head : {std::string("\x93NUMPY\x01\x00\x05\x00{'a':", 15), std::string("\x93NUMPY\x09\x00", 8),
                           std::string("\x93NUMPY\x01\x00\x10\x00{'descr': '<q9'", 26)}) {
    auto h = parse_npy_header(head, head.size(), "h.npy");
    EXPECT_FALSE(h.ok());
  }
}

TEST(Npy, WriteThenReadRoundTrips) {
  TempDir dir;
  auto t = Tensor::empty(DType::F32, {2, 3});
  ASSERT_TRUE(t.ok());
  for (size_t i = 0; i < 6; ++i) reinterpret_cast<float*>(t->mutable_bytes().data())[i] = static_cast<float>(i) * 1.5f;
  ASSERT_TRUE(write_npy(dir.file("a.npy"), t->view()).ok());
  std::string bytes = testing::read_bytes(dir.file("a.npy"));
  EXPECT_EQ(bytes.size(), 128u + 24u);  // data 64-byte aligned
  auto back = read_npy(dir.file("a.npy"));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(sha256_hex(back->bytes()), sha256_hex(t->bytes()));
  EXPECT_EQ(back->shape(), (Shape{2, 3}));
  // 0-dim and 1-dim shapes are spelled as Python tuples.
  auto s = Tensor::empty(DType::I64, {});
  auto one = Tensor::empty(DType::U8, {4});
  ASSERT_TRUE(s.ok() && one.ok());
  EXPECT_NE(serialize_npy(s->view())->find("'shape': ()"), std::string::npos);
  EXPECT_NE(serialize_npy(one->view())->find("'shape': (4,)"), std::string::npos);
  // NumPy has no bfloat16.
  auto bf = Tensor::empty(DType::BF16, {2});
  ASSERT_TRUE(bf.ok());
  Status st = write_npy(dir.file("bf.npy"), bf->view());
  EXPECT_NE(st.message().find("no BF16"), std::string::npos) << st.to_string();
  EXPECT_FALSE(fs::exists(dir.file("bf.npy")));
}

TEST(NpCache, DumpsOnceThenReadsBack) {
  TempDir model;
  fs::copy_file(fixture("legacy.bin"), model.file("pytorch_model.bin"));
  std::vector<std::string> files = {model.file("pytorch_model.bin")};
  // legacy.bin holds a bfloat16 tensor: NumPy cannot, as in the reference; the error names it.
  auto bad = np_cache_prepare(files, model.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().tensor(), "q");
  EXPECT_FALSE(fs::exists(model.file("np/weight_names.json")));
  fs::remove(model.file("pytorch_model.bin"));
  fs::copy_file(fixture("nested.pt"), model.file("pytorch_model-00001-of-00002.bin"));
  fs::copy_file(fixture("state_dict.bin"), model.file("pytorch_model-00002-of-00002.bin"));
  files = {model.file("pytorch_model-00001-of-00002.bin"), model.file("pytorch_model-00002-of-00002.bin")};
  auto r = np_cache_prepare(files, model.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->dumped);
  const nlohmann::json all = expected();
  nlohmann::json ex = all["nested.pt"];
  for (auto& e : all["state_dict.bin"]) ex.push_back(e);
  ASSERT_EQ(r->names.size(), ex.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    EXPECT_EQ(r->names[i], ex[i]["name"].get<std::string>());
    auto t = np_cache_read(model.path(), r->names[i]);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(sha256_hex(t->bytes()), ex[i]["sha256"].get<std::string>()) << r->names[i];
  }
  EXPECT_TRUE(fs::exists(model.file("np/weight_names.json")));
  EXPECT_TRUE(fs::exists(model.file("np/0.weight")));  // no extension, as the reference names them
  auto again = np_cache_prepare(files, model.path());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->dumped);
  EXPECT_EQ(again->names, r->names);
}

TEST(NpCache, ConcurrentPreparersDumpOnce) {
  TempDir model;
  fs::copy_file(fixture("state_dict.bin"), model.file("pytorch_model.bin"));
  std::vector<std::string> files = {model.file("pytorch_model.bin")};
  std::atomic<int> dumped{0}, ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      auto r = np_cache_prepare(files, model.path());
      if (r.ok()) {
        ++ok;
        dumped += r->dumped;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(dumped.load(), 1);
}

TEST(NpCache, RefusesNamesThatAreNotPlainFileNames) {
  TempDir model;
  auto t = Tensor::empty(DType::F32, {1});
  ASSERT_TRUE(t.ok());
  std::vector<NamedTensor> ts = {{"../escape", t->view()}};
  ASSERT_TRUE(write_safetensors(model.file("model.safetensors"), ts).ok());
  auto r = np_cache_prepare({model.file("model.safetensors")}, model.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().tensor(), "../escape");
  EXPECT_FALSE(fs::exists(model.file("escape")));
  // A hostile weight_names.json.
  fs::create_directories(model.file("np"));
  testing::write_bytes(model.file("np/weight_names.json"), "[\"../../etc/passwd\"]");
  auto names = np_cache_names(model.path());
  ASSERT_FALSE(names.ok());
  EXPECT_NE(names.status().to_string().find("plain file name"), std::string::npos);
}

}  // namespace
}  // namespace wl

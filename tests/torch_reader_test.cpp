// PyTorch checkpoints: real files written by torch 1.13 (tests/data/torch, see
// make_fixtures.py), compared with what torch.load saw; hostile files refused.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "torch/torch_pickle.h"
#include "torch/zip_reader.h"
#include "weightlift/checkpoint.h"
#include "weightlift/hash.h"
#include "weightlift/torch.h"

namespace wl {
namespace {

using testing::TempDir;

std::string fixture(const std::string& name) {
  return std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + name;
}

nlohmann::json expected() {
  std::ifstream in(fixture("expected.json"));
  return nlohmann::json::parse(in);
}

void check_against_torch(const std::string& file) {
  SCOPED_TRACE(file);
  auto ex = expected()[file];
  ASSERT_FALSE(ex.is_null());
  auto ck = TorchCheckpoint::open(fixture(file));
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ASSERT_EQ((*ck)->tensors().size(), ex.size());
  std::map<std::string, size_t> storage_of;
  for (size_t i = 0; i < ex.size(); ++i) {
    const auto& e = ex[i];
    const auto& info = (*ck)->tensors()[i];
    const auto& st = (*ck)->strided()[i];
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info.name, e["name"].get<std::string>());
    EXPECT_EQ(dtype_name(info.dtype), e["dtype"].get<std::string>());
    EXPECT_EQ(info.shape, e["shape"].get<Shape>());
    if (file != "bigendian.pt") {
      EXPECT_EQ(st.strides, e["strides"].get<std::vector<int64_t>>());
      EXPECT_EQ(st.storage_offset, e["storage_offset"].get<uint64_t>());
      EXPECT_EQ(st.contiguous, e["contiguous"].get<bool>());
      EXPECT_EQ(info.file_offset.has_value(), st.contiguous);
    }
    if (!e["shares_with"].is_null()) EXPECT_EQ(st.storage, storage_of.at(e["shares_with"].get<std::string>()));
    storage_of.emplace(info.name, st.storage);
    auto v = (*ck)->view(i);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->nbytes(), info.nbytes);
    EXPECT_EQ(sha256_hex(v->bytes()), e["sha256"].get<std::string>());
    auto r = (*ck)->read(i);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(sha256_hex(r->bytes()), e["sha256"].get<std::string>());
  }
}

TEST(TorchReader, EveryDtypeZeroDimAndEmpty) { check_against_torch("dtypes.pt"); }
TEST(TorchReader, ViewsSharedStoragesTransposes) { check_against_torch("views.bin"); }
TEST(TorchReader, ModuleStateDictOrderedDict) { check_against_torch("state_dict.bin"); }
TEST(TorchReader, Parameters) { check_against_torch("params.pt"); }
TEST(TorchReader, NestedAndWrapped) {
  check_against_torch("nested.pt");
  check_against_torch("wrapped.bin");
}
TEST(TorchReader, LegacyFormat) {
  check_against_torch("legacy.bin");
  auto ck = TorchCheckpoint::open(fixture("legacy.bin"));
  ASSERT_TRUE(ck.ok());
  EXPECT_TRUE((*ck)->legacy_format());
}
TEST(TorchReader, Zip64) { check_against_torch("zip64.pt"); }
TEST(TorchReader, BigEndianIsByteSwapped) {
  check_against_torch("bigendian.pt");
  auto ck = TorchCheckpoint::open(fixture("bigendian.pt"));
  ASSERT_TRUE(ck.ok());
  EXPECT_TRUE((*ck)->big_endian());
  for (auto& t : (*ck)->tensors()) EXPECT_FALSE(t.file_offset.has_value()) << t.name;
}

TEST(TorchReader, ContiguousViewsAreZeroCopyAndTiedStorageIsShared) {
  auto ck = TorchCheckpoint::open(fixture("views.bin"));
  ASSERT_TRUE(ck.ok());
  auto& ts = (*ck)->strided();
  ASSERT_EQ(ts[0].name, "embed.weight");
  ASSERT_EQ(ts[1].name, "lm_head.weight");
  EXPECT_EQ(ts[0].storage, ts[1].storage);
  auto a = (*ck)->view(0), b = (*ck)->view(1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data(), b->data());  // both point into the mapping
  auto storage = (*ck)->storage_bytes(ts[0].storage);
  ASSERT_TRUE(storage.ok());
  EXPECT_EQ(storage->data(), a->data());
  EXPECT_EQ((*ck)->format_name(), "pytorch");
}

TEST(TorchReader, UnwrapsStateDictOnRequest) {
  auto ck = TorchCheckpoint::open(fixture("wrapped.bin"), Env::Default(), {.unwrap_state_dict = true});
  ASSERT_TRUE(ck.ok());
  EXPECT_TRUE((*ck)->unwrapped_state_dict());
  ASSERT_EQ((*ck)->tensors().size(), 2u);
  EXPECT_EQ((*ck)->tensors()[0].name, "w");
}

// An Env whose files cannot be mapped: views fall back to reads.
class NoMmapEnv : public EnvWrapper {
 public:
  NoMmapEnv() : EnvWrapper(Env::Default()) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions&) override {
    return target()->open(path, {.mode = FileMode::kPread});
  }
};

TEST(TorchReader, WorksWithoutMmap) {
  NoMmapEnv env;
  auto ck = open_checkpoint(fixture("views.bin"), &env);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto ex = expected()["views.bin"];
  for (size_t i = 0; i < ex.size(); ++i) {
    auto v = (*ck)->view(i);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(sha256_hex(v->bytes()), ex[i]["sha256"].get<std::string>());
  }
}

// ---- hostile and broken files -------------------------------------------------

std::string open_error(const std::string& path) {
  auto ck = open_checkpoint(path);
  if (ck.ok()) return "";
  EXPECT_EQ(ck.status().file(), path);
  return ck.status().to_string();
}

TEST(TorchHostile, GlobalsOutsideTheAllowlistAreRefusedByName) {
  std::string e = open_error(fixture("evil_system.pt"));
  EXPECT_NE(e.find("'posix.system'"), std::string::npos) << e;
  EXPECT_NE(e.find("evil_system.pt"), std::string::npos) << e;
  e = open_error(fixture("evil_eval.pt"));
  EXPECT_NE(e.find("'builtins.eval'"), std::string::npos) << e;
}

TEST(TorchHostile, StorageShorterThanDeclared) {
  std::string e = open_error(fixture("short_storage.pt"));
  EXPECT_NE(e.find("holds 60 bytes"), std::string::npos) << e;
}

TEST(TorchHostile, HugeDeclaredSizes) {
  std::string e = open_error(fixture("huge_storage.pt"));
  EXPECT_NE(e.find("more than the file holds"), std::string::npos) << e;
}

TEST(TorchHostile, TruncatedAndRandom) {
  EXPECT_NE(open_error(fixture("truncated.bin")).find("end-of-central-directory"), std::string::npos);
  EXPECT_NE(open_error(fixture("random.bin")).find("not a PyTorch checkpoint"), std::string::npos);
}

TEST(TorchHostile, EveryTruncationAndByteFlipFailsCleanly) {
  // A small fuzz: every prefix of a zip and a legacy file, and random byte flips.
  TempDir dir;
  for (std::string name : {"views.bin", "legacy.bin"}) {
    std::string data = testing::read_bytes(fixture(name));
    std::string path = dir.file(name);
    for (size_t cut = 0; cut < data.size(); cut += (cut < 64 ? 1 : 7)) {
      testing::write_bytes(path, data.substr(0, cut));
      auto ck = open_checkpoint(path);
      if (ck.ok()) {
        for (size_t i = 0; i < (*ck)->tensors().size(); ++i) (void)(*ck)->view(i);
      } else {
        EXPECT_EQ(ck.status().file(), path);
      }
    }
    std::mt19937 rng(42);
    for (int round = 0; round < 300; ++round) {
      std::string m = data;
      for (int k = 0; k < 4; ++k) m[rng() % m.size()] = static_cast<char>(rng());
      testing::write_bytes(path, m);
      auto ck = open_checkpoint(path);
      if (ck.ok()) {
        for (size_t i = 0; i < (*ck)->tensors().size(); ++i) (void)(*ck)->view(i);
      }
    }
  }
}

// ---- the unpickler on hand-written pickles ------------------------------------

Result<pickle::Value*> unpickle(pickle::Unpickler& u, std::string_view bytes) { return u.load(bytes); }

TEST(TorchPickle, RejectsBadStreams) {
  struct Case {
    std::string bytes;
    std::string error;
  };
#define B(lit) std::string(lit, sizeof(lit) - 1)
  std::vector<Case> cases = {
      {B("\x80\x02"), "truncated"},
      {B("\x80\x02q\x00."), "stack underflow"},
      {B("\x80\x02h\x05"
         "."),
       "memo key 5"},
      {B("\x80\x02K\x01K\x02"
         "u."),
       "no MARK"},
      {B("\x80\x02I1\n."), "unsupported pickle opcode 0x49"},
      {B("\x80\x09"
         "."),
       "protocol 9"},
      {B("\x80\x02X\xff\xff\xff\x7f"
         "ab."),
       "runs past the end"},
      {B("\x80\x02"
         "cos\nsystem\n."),
       "'os.system'"},
      {B("\x80\x02\x8c\x08"
         "builtins\x8c\x04"
         "exec\x93."),
       "'builtins.exec'"},
      {B("\x80\x02"
         "ctorch\nFloatStorage\n)R."),
       "cannot be called"},
      {B("\x80\x02]q\x00K\x01Q."), "persistent_load id"},
      {B("\x80\x02K\x01K\x02"
         "b."),
       "BUILD is only allowed"},
      {B("\x80\x02"
         "ctorch._utils\n_rebuild_sparse_tensor\n)R."),
       "not supported"},
  };
#undef B
  for (auto& c : cases) {
    pickle::Unpickler u("x.pkl", nullptr);
    auto r = unpickle(u, c.bytes);
    ASSERT_FALSE(r.ok()) << c.error;
    EXPECT_NE(r.status().to_string().find(c.error), std::string::npos) << r.status().to_string();
    EXPECT_EQ(r.status().file(), "x.pkl");
  }
}

// Every opcode the unpickler accepts, in one pickle (a list of what each
// pushes), and the values it decodes to.
TEST(TorchPickle, DecodesEveryOpcodeItAccepts) {
  using namespace std::string_view_literals;
  std::string p;
  auto op = [&](std::string_view bytes) { p.append(bytes.data(), bytes.size()); };
  auto u32 = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) p += static_cast<char>((v >> (8 * k)) & 0xff);
  };
  auto u64 = [&](uint64_t v) {
    for (int k = 0; k < 8; ++k) p += static_cast<char>((v >> (8 * k)) & 0xff);
  };
  auto s1 = [&](std::string_view s) {  // SHORT_BINUNICODE
    p += '\x8c';
    p += static_cast<char>(s.size());
    op(s);
  };
  op("\x80\x04"sv);  // PROTO 4
  p += '\x95';       // FRAME
  u64(1000);
  op("("sv);  // MARK: the list of results
  // 0-10: numbers, booleans, None
  op("J"sv);  // BININT -2
  u32(0xfffffffe);
  op("K\x07"sv);             // BININT1 7
  op("M\x00\x01"sv);         // BININT2 256
  op("\x8a\x01\xff"sv);      // LONG1 -1
  op("\x8a\x02\x00\x80"sv);  // LONG1 -32768
  op("\x8a\x00"sv);          // LONG1 0
  op("\x8a\x09"sv);          // LONG1 of 9 bytes: kept raw
  op("123456789"sv);
  op("\x88\x89N"sv);                          // NEWTRUE NEWFALSE NONE
  op("G\x3f\xf8\x00\x00\x00\x00\x00\x00"sv);  // BINFLOAT 1.5
  // 11-18: strings and bytes
  op("X"sv);  // BINUNICODE
  u32(2);
  op("ab"sv);
  s1("c");
  p += '\x8d';  // BINUNICODE8
  u64(1);
  op("d"sv);
  op("U\x01"
     "e"sv);  // SHORT_BINSTRING
  op("T"sv);  // BINSTRING
  u32(1);
  op("f"sv);
  op("C\x01"
     "g"sv);  // SHORT_BINBYTES
  op("B"sv);  // BINBYTES
  u32(1);
  op("h"sv);
  p += '\x8e';  // BINBYTES8
  u64(1);
  op("i"sv);
  // 19-26: tuples, lists, sets
  op(")"sv);                       // EMPTY_TUPLE
  op("K\x01\x85"sv);               // TUPLE1
  op("K\x01K\x02\x86"sv);          // TUPLE2
  op("K\x01K\x02K\x03\x87"sv);     // TUPLE3
  op("(K\x01K\x02K\x03K\x04t"sv);  // MARK ... TUPLE
  op("(K\x05l"sv);                 // MARK ... LIST
  op("]K\x06"
     "a(K\x07K\x08"
     "e"sv);                    // EMPTY_LIST APPEND MARK ... APPENDS
  op("\x8f(K\x01K\x02\x90"sv);  // EMPTY_SET MARK ... ADDITEMS
  // 27-29: dicts
  op("("sv);
  s1("a");
  op("K\x01"sv);
  s1("b");
  op("K\x02"
     "d"sv);  // DICT {a: 1, b: 2}
  op("}"sv);
  s1("a");
  op("K\x01s("sv);  // EMPTY_DICT SETITEM MARK
  s1("a");
  op("K\x09"sv);
  s1("c");
  op("K\x03u"sv);                         // SETITEMS: {a: 9, c: 3}
  op("ccollections\nOrderedDict\n)R"sv);  // GLOBAL EMPTY_TUPLE REDUCE: OrderedDict()
  // 30: STACK_GLOBAL of a dtype
  s1("torch");
  s1("float32");
  op("\x93"sv);
  // 31-36: the memo
  op("K\x2aq\x01h\x01"sv);  // BININT1 BINPUT 1; BINGET 1
  op("K\x2br"sv);           // LONG_BINPUT 300
  u32(300);
  op("j"sv);  // LONG_BINGET 300
  u32(300);
  op("K\x2c\x94h\x02"sv);  // MEMOIZE (memo index 2), BINGET 2
  // 37-38: DUP; POP and POP_MARK leave nothing
  op("K\x2d"
     "2"sv);
  op("K\x63"
     "0(K\x01K\x02"
     "1"sv);
  // 39: a Parameter made by NEWOBJ from a tensor rebuilt from a persistent storage, then BUILD
  op("ctorch.nn.parameter\nParameter\n"sv);
  op("ctorch._utils\n_rebuild_tensor_v2\n(("sv);
  s1("storage");
  op("ctorch\nFloatStorage\n"sv);
  s1("0");
  s1("cpu");
  op("K\x04tQK\x00K\x04\x85K\x01\x85\x89)t"sv);  // BINPERSID, offset, size, stride, requires_grad, hooks
  op("R\x88\x86\x81"sv);                         // REDUCE; (tensor, True); NEWOBJ
  op("Nb"sv);                                    // BUILD with a None state
  op("l."sv);                                    // LIST, STOP

  std::vector<pickle::StorageRequest> storages;
  pickle::Unpickler u("all.pkl", [&](const pickle::StorageRequest& r) -> Result<size_t> {
    storages.push_back(r);
    return storages.size() - 1;
  });
  size_t consumed = 0;
  auto r = u.load(p, &consumed);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(consumed, p.size());
  const pickle::Value* root = *r;
  ASSERT_EQ(root->kind, pickle::Kind::kList);
  const auto& v = root->items;
  ASSERT_EQ(v.size(), 40u);
  const int64_t ints[] = {-2, 7, 256, -1, -32768, 0};
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_EQ(v[k]->kind, pickle::Kind::kInt) << k;
    EXPECT_EQ(v[k]->i, ints[k]) << k;
  }
  EXPECT_EQ(v[6]->kind, pickle::Kind::kOther);
  EXPECT_EQ(v[6]->s, "123456789");
  EXPECT_EQ(v[7]->kind, pickle::Kind::kBool);
  EXPECT_EQ(v[7]->i, 1);
  EXPECT_EQ(v[8]->i, 0);
  EXPECT_EQ(v[9]->kind, pickle::Kind::kNone);
  EXPECT_EQ(v[10]->kind, pickle::Kind::kFloat);
  EXPECT_EQ(v[10]->f, 1.5);
  const char* strs[] = {"ab", "c", "d", "e", "f", "g", "h", "i"};
  for (size_t k = 0; k < 8; ++k) {
    EXPECT_EQ(v[11 + k]->kind, k < 5 ? pickle::Kind::kStr : pickle::Kind::kBytes) << k;
    EXPECT_EQ(v[11 + k]->s, strs[k]);
  }
  const size_t tuple_sizes[] = {0, 1, 2, 3, 4};
  for (size_t k = 0; k < 5; ++k) {
    EXPECT_EQ(v[19 + k]->kind, pickle::Kind::kTuple) << k;
    EXPECT_EQ(v[19 + k]->items.size(), tuple_sizes[k]) << k;
  }
  EXPECT_EQ(v[22]->items[2]->i, 3);
  EXPECT_EQ(v[24]->kind, pickle::Kind::kList);
  ASSERT_EQ(v[24]->items.size(), 1u);
  EXPECT_EQ(v[24]->items[0]->i, 5);
  ASSERT_EQ(v[25]->items.size(), 3u);
  EXPECT_EQ(v[25]->items[0]->i, 6);
  EXPECT_EQ(v[25]->items[2]->i, 8);
  EXPECT_EQ(v[26]->kind, pickle::Kind::kSet);
  EXPECT_EQ(v[26]->items.size(), 2u);
  auto dict = [](const pickle::Value* d) {
    std::vector<std::pair<std::string, int64_t>> out;
    for (size_t k = 0; k + 1 < d->items.size(); k += 2) out.emplace_back(d->items[k]->s, d->items[k + 1]->i);
    return out;
  };
  using Items = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(v[27]->kind, pickle::Kind::kDict);
  EXPECT_EQ(dict(v[27]), (Items{{"a", 1}, {"b", 2}}));
  EXPECT_EQ(dict(v[28]), (Items{{"a", 9}, {"c", 3}}));  // the later value wins
  EXPECT_EQ(v[29]->kind, pickle::Kind::kDict);
  EXPECT_TRUE(v[29]->ordered);
  EXPECT_EQ(v[30]->kind, pickle::Kind::kDtype);
  EXPECT_EQ(v[30]->dtype, DType::F32);
  for (size_t k = 31; k < 37; ++k) EXPECT_EQ(v[k]->i, 0x2a + static_cast<int64_t>(k - 31) / 2) << k;
  EXPECT_EQ(v[37]->i, 0x2d);
  EXPECT_EQ(v[37], v[38]);  // DUP: the same object
  EXPECT_EQ(v[39]->kind, pickle::Kind::kTensor);
  ASSERT_EQ(u.tensors().size(), 1u);
  EXPECT_TRUE(u.tensors()[0].is_parameter);
  EXPECT_TRUE(u.tensors()[0].requires_grad);
  EXPECT_EQ(u.tensors()[0].sizes, (Shape{4}));
  ASSERT_EQ(storages.size(), 1u);
  EXPECT_EQ(storages[0].key, "0");
  EXPECT_EQ(storages[0].dtype, DType::F32);
  EXPECT_EQ(storages[0].numel, 4u);
}

TEST(TorchPickle, DeepNestingAndCyclesAreBounded) {
  // A list that contains itself: flattening must stop at the depth limit.
  pickle::Unpickler u("cyc.pkl", nullptr);
  auto r =
      u.load(std::string("\x80\x02]q\x00h\x00"
                         "a.",
                         9));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::pair<std::string, size_t>> out;
  Status s = pickle::flatten_tensors(*r, &out, "cyc.pkl");
  EXPECT_NE(s.to_string().find("nested deeper"), std::string::npos) << s.to_string();
  // 200000 nested MARKs are refused, not a crash.
  pickle::Unpickler u2("marks.pkl", nullptr);
  auto r2 = u2.load("\x80\x02" + std::string(200000, '(') + ".");
  EXPECT_NE(r2.status().to_string().find("too many nested MARKs"), std::string::npos);
}

TEST(TorchZip, RejectsBrokenDirectories) {
  TempDir dir;
  const std::string good = testing::read_bytes(fixture("views.bin"));
  auto corrupt_at = [&](const std::string& sig, size_t delta, std::string bytes) {
    std::string bad = good;
    size_t at = bad.rfind(sig);
    EXPECT_NE(at, std::string::npos);
    bad.replace(at + delta, bytes.size(), bytes);
    testing::write_bytes(dir.file("bad.pt"), bad);
    return open_error(dir.file("bad.pt"));
  };
  // torch writes zip64 end records: break the central directory offset there.
  std::string e = corrupt_at(std::string("PK\x06\x06", 4), 48, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8));
  EXPECT_NE(e.find("central directory"), std::string::npos) << e;
  // A bad central-directory entry signature.
  e = corrupt_at(std::string("PK\x01\x02", 4), 0, "XX");
  EXPECT_NE(e.find("bad signature"), std::string::npos) << e;
  // A local header offset pointing past the data.
  e = corrupt_at(std::string("PK\x01\x02", 4), 42, std::string("\xff\xff\xff\x7f", 4));
  EXPECT_NE(e.find("local header offset"), std::string::npos) << e;
  // A stored size larger than the file.
  e = corrupt_at(std::string("PK\x01\x02", 4), 20, std::string("\x00\x00\x00\x7f\x00\x00\x00\x7f", 8));
  EXPECT_NE(e.find("runs past the data area"), std::string::npos) << e;
}

}  // namespace
}  // namespace wl

// The safetensors reader and writer: a catalogue of hand-made malformed files
// (one per rule of the format, plus truncations and huge lengths), round-trip
// property tests and lazy/eager equivalence.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_util.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::st_prefix;
using testing::TempDir;
using testing::write_bytes;

struct Malformed {
  const char* label;
  std::string bytes;
  Code code;
  const char* message;  // substring of the error
  const char* tensor;   // tensor the error must name ("" when none)
};

std::string zeros(size_t n) { return std::string(n, '\0'); }

uint64_t load_le64_for_test(std::string_view s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// Headers that repeat a key: one file must never mean two things (the last
// value winning here, the first elsewhere). Compact, as writers write them.
std::vector<Malformed> duplicate_keys() {
  return {
      {"entry repeats dtype (safetensors: duplicate field)",
       st_prefix(R"({"w":{"dtype":"U8","dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "repeats the field 'dtype'", "w"},
      {"entry repeats shape",
       st_prefix(R"({"w":{"dtype":"F32","shape":[1],"shape":[2],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "repeats the field 'shape'", "w"},
      {"entry repeats data_offsets",
       st_prefix(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "repeats the field 'data_offsets'", "w"},
      {"entry repeats a field it does not need",
       st_prefix(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1,"x":[2]}})") + zeros(8),
       Code::kCorruptData, "repeats the field 'x'", "w"},
      {"__metadata__ repeats a key (safetensors keeps the last)",
       st_prefix(
           R"({"__metadata__":{"format":"pt","format":"tf"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") +
           zeros(8),
       Code::kCorruptData, "__metadata__ repeats the key 'format'", ""},
      {"__metadata__ twice",
       st_prefix(
           R"({"__metadata__":{"a":"1"},"__metadata__":{"a":"1"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") +
           zeros(8),
       Code::kCorruptData, "duplicate tensor name", "__metadata__"},
      {"a tensor name twice, the second entry with other bytes (safetensors keeps the last)",
       st_prefix(
           R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})") +
           zeros(8),
       Code::kCorruptData, "duplicate tensor name", "w"},
  };
}

std::vector<Malformed> catalogue() {
  const std::string good_w = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Malformed> c = {
      {"empty file", "", Code::kCorruptData, "too small", ""},
      {"seven bytes", std::string(7, '\x01'), Code::kCorruptData, "too small", ""},
      {"length past end", le64(100) + "{}", Code::kCorruptData, "past the end of the file", ""},
      {"length above 100MB cap", le64(100'000'001) + "{}", Code::kCorruptData, "exceeds the 100000000 byte limit", ""},
      {"length 2^64-1", le64(UINT64_MAX) + "{}", Code::kCorruptData, "exceeds", ""},
      {"header not starting with {", st_prefix(" {}     "), Code::kCorruptData, "does not start with '{'", ""},
      {"header is an array", st_prefix("[1,2,3] "), Code::kCorruptData, "does not start with '{'", ""},
      {"empty header", st_prefix(""), Code::kCorruptData, "does not start with '{'", ""},
      {"invalid JSON", st_prefix("{\"w\":   "), Code::kCorruptData, "not valid JSON", ""},
      {"trailing garbage", st_prefix("{}xyz   "), Code::kCorruptData, "not valid JSON", ""},
      {"invalid UTF-8", st_prefix("{\"\xff\xfe\":1}"), Code::kCorruptData, "not valid UTF-8", ""},
      {"overlong UTF-8", st_prefix("{\"\xc0\xaf\":{}}"), Code::kCorruptData, "not valid UTF-8", ""},
      {"entry not an object", st_prefix(R"({"w":5})"), Code::kCorruptData, "entry is not an object", "w"},
      {"missing dtype", st_prefix(R"({"w":{"shape":[1],"data_offsets":[0,4]}})") + zeros(4), Code::kCorruptData,
       "dtype", "w"},
      {"unknown dtype", st_prefix(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})") + zeros(16),
       Code::kCorruptData, "unknown dtype 'F128'", "w"},
      {"lower-case dtype", st_prefix(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})") + zeros(4),
       Code::kCorruptData, "unknown dtype", "w"},
      {"non-safetensors dtype", st_prefix(R"({"w":{"dtype":"C128","shape":[1],"data_offsets":[0,16]}})") + zeros(16),
       Code::kCorruptData, "unknown dtype", "w"},
      {"negative dim", st_prefix(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})") + zeros(4),
       Code::kCorruptData, "non-negative integers", "w"},
      {"float dim", st_prefix(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})") + zeros(4),
       Code::kCorruptData, "non-negative integers", "w"},
      {"string dim", st_prefix(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "non-negative integers", "w"},
      {"shape not a list", st_prefix(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})") + zeros(16),
       Code::kCorruptData, "shape", "w"},
      {"element count overflows",
       st_prefix(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "overflows", "w"},
      {"byte count overflows",
       st_prefix(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "overflows", "w"},
      {"offsets end before begin", st_prefix(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})") + zeros(4),
       Code::kCorruptData, "end before they begin", "w"},
      {"offsets not two", st_prefix(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})") + zeros(4),
       Code::kCorruptData, "two non-negative integers", "w"},
      {"negative offset", st_prefix(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})") + zeros(4),
       Code::kCorruptData, "two non-negative integers", "w"},
      {"size mismatch", st_prefix(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})") + zeros(8),
       Code::kCorruptData, "needs 12", "w"},
      {"gap between tensors",
       st_prefix(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})") +
           zeros(12),
       Code::kCorruptData, "gap in the data area", "b"},
      {"overlapping tensors",
       st_prefix(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") +
           zeros(8),
       Code::kCorruptData, "overlaps", "b"},
      {"data does not start at 0", st_prefix(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") + zeros(8),
       Code::kCorruptData, "gap", "w"},
      {"data shorter than declared (truncated)", st_prefix("{" + good_w + "}") + zeros(4), Code::kCorruptData,
       "data area ends at byte", ""},
      {"trailing bytes after data", st_prefix("{" + good_w + "}") + zeros(12), Code::kCorruptData,
       "data area ends at byte", ""},
      {"duplicate tensor name",
       st_prefix(
           R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") +
           zeros(8),
       Code::kCorruptData, "duplicate tensor name", "w"},
      {"metadata not a map", st_prefix(R"({"__metadata__":[1]})"), Code::kCorruptData, "string-to-string", ""},
      {"metadata value not a string", st_prefix(R"({"__metadata__":{"format":1}})"), Code::kCorruptData,
       "is not a string", ""},
      {"sub-byte dtype with odd count",
       st_prefix(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})") + zeros(2), Code::kCorruptData,
       "whole number of bytes", "w"},
      {"truncated header", le64(64) + "{\"w\":{\"dtype\":", Code::kCorruptData, "past the end of the file", ""},
  };
  for (auto& d : duplicate_keys()) c.push_back(d);
  return c;
}

TEST(SafetensorsMalformed, CatalogueHasAtLeast25Cases) { EXPECT_GE(catalogue().size(), 25u); }

TEST(SafetensorsMalformed, EveryCaseIsRejectedWithItsMessage) {
  TempDir dir;
  int i = 0;
  for (const auto& m : catalogue()) {
    SCOPED_TRACE(m.label);
    std::string path = dir.file("bad" + std::to_string(i++) + ".safetensors");
    write_bytes(path, m.bytes);
    for (FileMode mode : {FileMode::kMmap, FileMode::kPread}) {
      auto f = SafetensorsFile::open(path, mode);
      ASSERT_FALSE(f.ok());
      EXPECT_EQ(f.status().code(), m.code) << f.status().to_string();
      EXPECT_NE(f.status().message().find(m.message), std::string::npos) << f.status().to_string();
      EXPECT_EQ(f.status().file(), path);
      EXPECT_EQ(f.status().tensor(), m.tensor) << f.status().to_string();
    }
  }
}

// The two parsers (the compact fast path and the general SAX one) refuse a
// repeated key alike: the same header with whitespace (which only the general
// parser reads) gives the same error, and so does every entry of the
// catalogue written with a space after each ':'.
TEST(SafetensorsMalformed, RepeatedKeysAreRefusedByBothParsers) {
  for (const auto& m : duplicate_keys()) {
    SCOPED_TRACE(m.label);
    const uint64_t n = load_le64_for_test(m.bytes);
    const std::string compact = m.bytes.substr(8, n), data = m.bytes.substr(8 + n);
    std::string spaced;
    for (char ch : compact) spaced += ch == ':' ? std::string(": ") : std::string(1, ch);
    for (const std::string& h : {compact, spaced}) {
      auto r = parse_safetensors_header(h, 8 + h.size() + data.size(), "f.safetensors");
      ASSERT_FALSE(r.ok()) << h;
      EXPECT_EQ(r.status().code(), m.code);
      EXPECT_NE(r.status().message().find(m.message), std::string::npos) << r.status().to_string();
      EXPECT_EQ(r.status().tensor(), m.tensor) << r.status().to_string();
    }
  }
  // Without the repeat, both read the same header.
  const std::string ok = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string spaced;
  for (char ch : ok) spaced += ch == ':' ? std::string(": ") : std::string(1, ch);
  auto a = parse_safetensors_header(ok, 8 + ok.size() + 8, "f");
  auto b = parse_safetensors_header(spaced, 8 + spaced.size() + 8, "f");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->metadata, b->metadata);
  ASSERT_EQ(a->tensors.size(), 1u);
  ASSERT_EQ(b->tensors.size(), 1u);
  EXPECT_EQ(a->tensors[0].name, b->tensors[0].name);
  EXPECT_EQ(a->tensors[0].dtype, b->tensors[0].dtype);
  EXPECT_EQ(a->tensors[0].shape, b->tensors[0].shape);
  EXPECT_EQ(a->tensors[0].nbytes, b->tensors[0].nbytes);
}

TEST(SafetensorsMalformed, RandomBytesNeverCrash) {
  std::mt19937_64 rng(42);
  TempDir dir;
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 200, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    if (i % 3 == 0 && s.size() >= 8) {  // plausible length prefix
      uint64_t n = s.size() - 8 - (s.size() > 9 ? rng() % 2 : 0);
      for (int k = 0; k < 8; ++k) s[k] = static_cast<char>((n >> (8 * k)) & 0xFF);
      s[8 % s.size()] = '{';
    }
    auto r = parse_safetensors_header(std::string_view(s).substr(std::min<size_t>(8, s.size())), s.size());
    (void)r;
    std::string path = dir.file("r.safetensors");
    write_bytes(path, s);
    auto f = SafetensorsFile::open(path);
    if (f.ok()) {
      for (auto& t : (*f)->tensors()) ASSERT_TRUE((*f)->read(t.name).ok());
    }
  }
}

TEST(SafetensorsReader, ValidEdgeCases) {
  TempDir dir;
  // Empty header object, padding, zero-size and 0-dim tensors, metadata.
  std::string h =
      R"({"__metadata__":{"format":"pt"},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
  std::string bytes = st_prefix(h + "   ") + le64(42);
  std::string path = dir.file("ok.safetensors");
  write_bytes(path, bytes);
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->names(), (std::vector<std::string>{"e", "s"}));
  auto s = (*f)->get("s");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shape().empty());
  int64_t v = 0;
  std::memcpy(&v, s->data(), 8);
  EXPECT_EQ(v, 42);
  auto e = (*f)->read("e");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->nbytes(), 0u);
  EXPECT_EQ((*f)->get("nope").status().code(), Code::kNotFound);
  EXPECT_EQ((*f)->get("nope").status().tensor(), "nope");
  EXPECT_EQ((*f)->read_slice("s", 0, 0, 1).status().code(), Code::kInvalidArgument);

  write_bytes(dir.file("empty.safetensors"), st_prefix("{}      "));
  auto empty = SafetensorsFile::open(dir.file("empty.safetensors"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE((*empty)->tensors().empty());
}

TEST(SafetensorsReader, MissingFileIsNotFound) {
  auto f = SafetensorsFile::open("/nonexistent/x.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_EQ(f.status().file(), "/nonexistent/x.safetensors");
}

// ---- round trips -----------------------------------------------------------

struct Owned {
  std::string name;
  Tensor t;
};

std::vector<Owned> random_tensors(std::mt19937_64& rng, int count) {
  const DType types[] = {DType::BOOL, DType::U8,  DType::I8,      DType::I16,     DType::U16,    DType::F16,
                         DType::BF16, DType::I32, DType::U32,     DType::F32,     DType::F64,    DType::I64,
                         DType::U64,  DType::C64, DType::F8_E4M3, DType::F8_E5M2, DType::F8_E8M0};
  std::vector<Owned> out;
  for (int i = 0; i < count; ++i) {
    DType dt = types[rng() % std::size(types)];
    Shape shape;
    int nd = static_cast<int>(rng() % 4);
    for (int d = 0; d < nd; ++d) shape.push_back(static_cast<int64_t>(rng() % 7));
    auto t = Tensor::empty(dt, shape);
    EXPECT_TRUE(t.ok());
    for (auto& b : t->mutable_bytes()) b = static_cast<std::byte>(rng());
    out.push_back({"t" + std::to_string(rng() % 100000) + "_" + std::to_string(i), std::move(*t)});
  }
  return out;
}

TEST(SafetensorsRoundTrip, RandomDtypesAndShapes) {
  TempDir dir;
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 40; ++iter) {
    auto owned = random_tensors(rng, 1 + static_cast<int>(rng() % 12));
    std::vector<NamedTensor> nt;
    for (auto& o : owned) nt.push_back({o.name, o.t.view()});
    std::map<std::string, std::string> meta;
    if (iter % 2) meta = {{"format", "pt"}, {"k\"ey", "v\nal"}};
    std::string path = dir.file("rt.safetensors");
    ASSERT_TRUE(write_safetensors(path, nt, meta).ok());
    auto ser = serialize_safetensors(nt, meta);
    ASSERT_TRUE(ser.ok());
    EXPECT_EQ(*ser, testing::read_bytes(path));
    for (FileMode mode : {FileMode::kMmap, FileMode::kPread}) {
      auto f = SafetensorsFile::open(path, mode);
      ASSERT_TRUE(f.ok()) << f.status().to_string();
      EXPECT_EQ((*f)->metadata(), meta);
      ASSERT_EQ((*f)->tensors().size(), owned.size());
      for (auto& o : owned) {
        auto v = (*f)->get(o.name);
        ASSERT_TRUE(v.ok());
        EXPECT_EQ(v->dtype(), o.t.dtype());
        EXPECT_EQ(v->shape(), o.t.shape());
        ASSERT_EQ(v->nbytes(), o.t.nbytes());
        if (v->nbytes()) EXPECT_EQ(0, std::memcmp(v->data(), o.t.bytes().data(), v->nbytes()));
        auto r = (*f)->read(o.name);
        ASSERT_TRUE(r.ok());
        if (r->nbytes()) EXPECT_EQ(0, std::memcmp(r->bytes().data(), o.t.bytes().data(), r->nbytes()));
      }
    }
    // The header is 8-aligned, so the data area starts aligned.
    auto h = SafetensorsFile::open(path);
    EXPECT_EQ((*h)->header().data_start % 8, 0u);
  }
}

TEST(SafetensorsRoundTrip, ReadRowsReadsOnlyThatRange) {
  TempDir dir;
  auto t = Tensor::empty(DType::I32, {10, 3});
  ASSERT_TRUE(t.ok());
  auto* p = reinterpret_cast<int32_t*>(t->mutable_bytes().data());
  for (int i = 0; i < 30; ++i) p[i] = i;
  std::vector<NamedTensor> nt = {{"m", t->view()}};
  std::string path = dir.file("rows.safetensors");
  ASSERT_TRUE(write_safetensors(path, nt).ok());
  for (FileMode mode : {FileMode::kMmap, FileMode::kPread}) {
    auto f = SafetensorsFile::open(path, mode);
    ASSERT_TRUE(f.ok());
    auto r = (*f)->read_slice("m", 0, 2, 5);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->shape(), (Shape{3, 3}));
    auto* q = reinterpret_cast<const int32_t*>(r->bytes().data());
    for (int i = 0; i < 9; ++i) EXPECT_EQ(q[i], 6 + i);
    auto clamp = (*f)->read_slice("m", 0, 8, 100);  // Python-style clamping
    ASSERT_TRUE(clamp.ok());
    EXPECT_EQ(clamp->shape()[0], 2);
    EXPECT_EQ((*f)->read_slice("m", 0, 5, 2).status().code(), Code::kInvalidArgument);
    auto cols = (*f)->read_slice("m", 1, 1, 3);  // columns: strided runs, only those bytes
    ASSERT_TRUE(cols.ok()) << cols.status().to_string();
    EXPECT_EQ(cols->shape(), (Shape{10, 2}));
    auto* c = reinterpret_cast<const int32_t*>(cols->bytes().data());
    for (int r = 0; r < 10; ++r) {
      EXPECT_EQ(c[2 * r], 3 * r + 1);
      EXPECT_EQ(c[2 * r + 1], 3 * r + 2);
    }
    auto bad_dim = (*f)->read_slice("m", 2, 0, 1);
    EXPECT_NE(bad_dim.status().message().find("slice dim 2 is out of range"), std::string::npos)
        << bad_dim.status().to_string();
  }
}

// Headers as writers write them take a fast path (compact JSON, no escapes,
// no other keys); anything else the general parser reads. Inserting a space
// after the first '{' keeps a header's meaning but sends it down the general
// path: on random mutations of real headers both must accept the same
// headers with the same contents, and refuse the same ones.
TEST(SafetensorsHeaderFastPath, AgreesWithTheGeneralParserOnMutations) {
  std::mt19937_64 rng(11);
  const std::string alphabet = "{}[]:,\"\\ 0123456789-.eE_aFIU8";
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto owned = random_tensors(rng, 1 + static_cast<int>(rng() % 5));
    std::vector<NamedTensor> nt;
    for (auto& o : owned) nt.push_back({o.name, o.t.view()});
    std::map<std::string, std::string> meta;
    if (iter % 3 == 0) meta = {{"format", "pt"}, {"k", "v"}};
    auto L = plan_safetensors(nt, meta);
    ASSERT_TRUE(L.ok());
    std::string header = L->prefix.substr(8);
    const uint64_t data = L->total_size - L->prefix.size();
    for (int m = 0; m < 1 + static_cast<int>(rng() % 3) && iter % 10; ++m) {  // every 10th stays intact
      size_t at = 1 + rng() % (header.size() - 1);
      switch (rng() % 3) {
        case 0: header[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: header.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        default: header.erase(at, 1);
      }
    }
    if (header.empty() || header[0] != '{') continue;
    auto fast = parse_safetensors_header(header, 8 + header.size() + data);
    std::string spaced = "{ " + header.substr(1);
    auto general = parse_safetensors_header(spaced, 8 + spaced.size() + data);
    ASSERT_EQ(fast.ok(), general.ok()) << header << "\n" << (fast.ok() ? general : fast).status().to_string();
    if (!fast.ok()) {
      EXPECT_EQ(fast.status().code(), general.status().code()) << header;
      continue;
    }
    ++accepted;
    EXPECT_EQ(fast->metadata, general->metadata) << header;
    ASSERT_EQ(fast->tensors.size(), general->tensors.size()) << header;
    for (size_t i = 0; i < fast->tensors.size(); ++i) {
      const auto &a = fast->tensors[i], &b = general->tensors[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.dtype, b.dtype);
      EXPECT_EQ(a.shape, b.shape);
      EXPECT_EQ(a.nbytes, b.nbytes);
      EXPECT_EQ(a.offset - fast->data_start, b.offset - general->data_start);
    }
  }
  EXPECT_GT(accepted, 300);  // the intact headers, and mutations that stay valid
}

TEST(SafetensorsWriter, OrderAndFormatMatchHuggingFace) {
  // Larger alignment first, then by name; compact JSON; space padding.
  auto a = Tensor::empty(DType::U8, {3});
  auto b = Tensor::empty(DType::F32, {1});
  auto c = Tensor::empty(DType::F32, {2});
  std::vector<NamedTensor> nt = {{"z_u8", a->view()}, {"b_f32", c->view()}, {"a_f32", b->view()}};
  auto L = plan_safetensors(nt, {{"format", "pt"}});
  ASSERT_TRUE(L.ok());
  std::string header = L->prefix.substr(8);
  EXPECT_EQ(
      header,
      R"({"__metadata__":{"format":"pt"},"a_f32":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b_f32":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"z_u8":{"dtype":"U8","shape":[3],"data_offsets":[12,15]}})"
      "    ");
  EXPECT_EQ(L->prefix.size() % 8, 0u);
  EXPECT_EQ(L->total_size, L->prefix.size() + 15);
}

TEST(SafetensorsWriter, Float8FnuzKindsAreStoredAndSortedAsSafetensorsDoes) {
  // safetensors' Dtype order: ... F8_E8M0 < F8_E4M3FNUZ < F8_E5M2FNUZ < I16 ...
  TempDir dir;
  auto e8 = Tensor::empty(DType::F8_E8M0, {1});
  auto e4 = Tensor::empty(DType::F8_E4M3FNUZ, {2});
  auto e5 = Tensor::empty(DType::F8_E5M2FNUZ, {3});
  auto i16 = Tensor::empty(DType::I16, {1});
  std::vector<NamedTensor> nt = {{"a", e8->view()}, {"b", e4->view()}, {"c", e5->view()}, {"d", i16->view()}};
  auto L = plan_safetensors(nt);
  ASSERT_TRUE(L.ok()) << L.status().to_string();
  EXPECT_EQ(L->order, (std::vector<size_t>{3, 2, 1, 0}));
  std::string path = dir.file("fnuz.safetensors");
  ASSERT_TRUE(write_safetensors(path, nt).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find("b")->dtype, DType::F8_E4M3FNUZ);
  EXPECT_EQ((*f)->find("c")->dtype, DType::F8_E5M2FNUZ);
}

TEST(SafetensorsWriter, RejectsBadInputAndLeavesNoFile) {
  TempDir dir;
  auto a = Tensor::empty(DType::F32, {2});
  auto c = Tensor::empty(DType::C128, {1});
  std::string path = dir.file("out.safetensors");
  std::vector<NamedTensor> dup = {{"x", a->view()}, {"x", a->view()}};
  EXPECT_EQ(write_safetensors(path, dup).code(), Code::kInvalidArgument);
  std::vector<NamedTensor> bad_dtype = {{"x", c->view()}};
  auto s = write_safetensors(path, bad_dtype);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("C128"), std::string::npos);
  std::vector<NamedTensor> wrong_size = {{"x", TensorView(DType::F32, {3}, a->bytes(), nullptr)}};
  EXPECT_NE(write_safetensors(path, wrong_size).message().find("needs 12"), std::string::npos);
  std::vector<NamedTensor> reserved = {{"__metadata__", a->view()}};
  EXPECT_FALSE(write_safetensors(path, reserved).ok());
  EXPECT_TRUE(testing::list_dir(dir.path()).empty());  // nothing left behind, not even a temp file
}

TEST(SafetensorsWriter, UnwritableDirectoryIsAnErrorNamingThePath) {
  auto a = Tensor::empty(DType::F32, {2});
  std::vector<NamedTensor> nt = {{"x", a->view()}};
  auto s = write_safetensors("/nonexistent-dir/out.safetensors", nt);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.file(), "/nonexistent-dir/out.safetensors");
}

TEST(SafetensorsWriter, OverwriteIsAtomic) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  auto a = Tensor::empty(DType::F32, {2});
  std::vector<NamedTensor> nt = {{"x", a->view()}};
  ASSERT_TRUE(write_safetensors(path, nt).ok());
  std::string before = testing::read_bytes(path);
  std::vector<NamedTensor> dup = {{"x", a->view()}, {"x", a->view()}};
  EXPECT_FALSE(write_safetensors(path, dup).ok());
  EXPECT_EQ(testing::read_bytes(path), before);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"m.safetensors"});
}

}  // namespace
}  // namespace wl

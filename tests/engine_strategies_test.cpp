// Every strategy gives the same bytes; stream's memory cap, destinations,
// cancellation; the expert filter and TP reads are selective.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "engine_test_util.h"
#include "test_util.h"
#include "weightlift/checkpoint.h"
#include "weightlift/expert_filter.h"
#include "weightlift/loader.h"
#include "weightlift/synth.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::CountingEnv;
using testing::load_all;
using testing::make_f32;
using testing::TempDir;
using testing::write_st;

std::vector<std::string> synth_files(const TempDir& dir) {
  SynthOptions so;
  so.target_bytes = uint64_t{3} << 20;
  so.min_shards = 3;
  EXPECT_TRUE(synth_model(dir.path(), so).ok());
  return *resolve_weight_files(dir.path());
}

TEST(EngineStrategies, AllGiveIdenticalBytes) {
  TempDir dir;
  auto files = synth_files(dir);
  LoadOptions base;
  base.strategy = Strategy::kLazy;
  auto ref = load_all(files, base);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_GT(ref->size(), 10u);
  struct Case {
    Strategy s;
    int threads;
    uint64_t block;
    Toggle direct;
    uint64_t cap;
  };
  const Case cases[] = {
      {Strategy::kEager, 0, 0, Toggle::kAuto, 0},      {Strategy::kPrefetch, 2, 4096, Toggle::kAuto, 0},
      {Strategy::kAuto, 0, 0, Toggle::kAuto, 0},       {Strategy::kThreads, 2, 0, Toggle::kAuto, 0},
      {Strategy::kStream, 0, 0, Toggle::kOff, 0},      {Strategy::kStream, 3, 65536 + 512, Toggle::kOff, 0},
      {Strategy::kStream, 3, 65536, Toggle::kOn, 0},   {Strategy::kStream, 4, 4096, Toggle::kOn, 0},
      {Strategy::kStream, 2, 0, Toggle::kOn, 1 << 20}, {Strategy::kStream, 1, 0, Toggle::kAuto, 0},
  };
  for (const Case& c : cases) {
    LoadOptions o;
    o.strategy = c.s;
    o.threads = c.threads;
    o.block_size = c.block;
    o.direct = c.direct;
    o.max_memory = c.cap;
    LoadStats st;
    auto got = load_all(files, o, &st);
    ASSERT_TRUE(got.ok()) << strategy_name(c.s) << ": " << got.status().to_string();
    EXPECT_EQ(*got, *ref) << strategy_name(c.s) << " threads " << c.threads << " block " << c.block;
    EXPECT_EQ(st.tensors, ref->size());
  }
}

TEST(EngineStrategies, RoutesThroughCheckpointReader) {
  // A file with no known extension is sniffed by open_checkpoint.
  TempDir dir;
  write_st(dir.file("weights.data"), {{"a", make_f32({3, 4}, 1)}, {"b", make_f32({5}, 2)}});
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kThreads, Strategy::kStream}) {
    LoadOptions o;
    o.strategy = s;
    auto got = load_all({dir.file("weights.data")}, o);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->size(), 2u);
    EXPECT_EQ(got->at("b").size(), 20u);
  }
}

TEST(EngineStrategies, ErrorsNameTheFile) {
  TempDir dir;
  testing::write_bytes(dir.file("bad.safetensors"), "\x05\x00\x00\x00\x00\x00\x00\x00{}");
  for (Strategy s : {Strategy::kLazy, Strategy::kStream, Strategy::kThreads}) {
    LoadOptions o;
    o.strategy = s;
    auto r = load_all({dir.file("bad.safetensors")}, o);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().to_string().find("bad.safetensors"), std::string::npos) << r.status().to_string();
  }
  LoadOptions o;
  o.threads = -1;
  EXPECT_EQ(load_all({}, o).status().code(), Code::kInvalidArgument);
  o.threads = 0;
  o.tp_size = 2;
  o.tp_rank = 2;
  auto r = load_all({}, o);
  EXPECT_NE(r.status().message().find("outside [0, 2)"), std::string::npos);
}

TEST(EngineStream, DestinationsAreFilledInPlace) {
  TempDir dir;
  write_st(dir.file("m.safetensors"), {{"a", make_f32({64, 33}, 1)}, {"b", make_f32({7}, 2)}});
  std::map<std::string, std::vector<std::byte>> dsts;
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.block_size = 4096;
  o.direct = Toggle::kOn;
  auto dst = caller_destination([&](const TensorRequest& r) -> Result<Region> {
    auto& v = dsts[r.name];
    v.resize(r.nbytes);
    return Region{v.data(), v.size(), kCpu, nullptr};
  });
  o.destination = dst.get();
  int seen = 0;
  auto r = load_files({dir.file("m.safetensors")}, o, [&](LoadedTensor&& t) {
    EXPECT_EQ(t.view.owner(), nullptr);
    EXPECT_EQ(t.view.data(), dsts[t.name].data());
    ++seen;
    return Status();
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(seen, 2);
  Tensor a = make_f32({64, 33}, 1);
  EXPECT_EQ(std::memcmp(dsts["a"].data(), a.bytes().data(), a.nbytes()), 0);

  auto empty = caller_destination([&](const TensorRequest&) -> Result<Region> { return Region{}; });
  o.destination = empty.get();
  auto bad = load_all({dir.file("m.safetensors")}, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("destination holds 0 bytes"), std::string::npos) << bad.status().to_string();
}

TEST(EngineStream, MemoryCapBoundsOutstandingTensors) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 40; ++i) ts.push_back({"t" + std::to_string(i), make_f32({64, 1024}, i)});  // 256 KiB each
  write_st(dir.file("m.safetensors"), ts);
  for (Toggle dio : {Toggle::kOff, Toggle::kOn}) {
    LoadOptions o;
    o.strategy = Strategy::kStream;
    o.threads = 4;
    o.max_memory = 1 << 20;
    o.direct = dio;
    std::mutex mu;
    uint64_t outstanding = 0, peak = 0;
    std::vector<std::vector<std::byte>> keep(40);
    auto dst = caller_destination([&](const TensorRequest& r) -> Result<Region> {
      std::lock_guard lk(mu);
      outstanding += r.nbytes;
      peak = std::max(peak, outstanding);
      auto& v = keep[std::stoi(r.name.substr(1))];
      v.resize(r.nbytes);
      return Region{v.data(), v.size(), kCpu, nullptr};
    });
    o.destination = dst.get();
    auto r = load_files({dir.file("m.safetensors")}, o, [&](LoadedTensor&& t) {
      std::lock_guard lk(mu);
      outstanding -= t.view.nbytes();
      return Status();
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tensors, 40u);
    // The cap, plus one tensor that straddles the window's edge.
    EXPECT_LE(peak, o.max_memory + (256u << 10)) << "direct " << (dio == Toggle::kOn);
  }
}

TEST(EngineStream, ProgressCanCancel) {
  TempDir dir;
  auto files = synth_files(dir);
  for (Strategy s : {Strategy::kStream, Strategy::kLazy, Strategy::kThreads}) {
    LoadOptions o;
    o.strategy = s;
    uint64_t last_total = 0;
    o.progress = [&](const LoadProgress& p) {
      last_total = p.bytes_total;
      return p.tensors_done < 3;
    };
    auto r = load_all(files, o);
    ASSERT_EQ(r.status().code(), Code::kCancelled) << strategy_name(s);
    EXPECT_GT(last_total, 0u);
  }
}

// An MoE-shaped file: 4 experts x 2 weights, a scale per expert, and dense weights.
std::vector<std::pair<std::string, Tensor>> moe_tensors() {
  std::vector<std::pair<std::string, Tensor>> ts;
  int seed = 0;
  for (int e = 0; e < 4; ++e) {
    ts.push_back({"model.layers.0.mlp.experts." + std::to_string(e) + ".up_proj.weight", make_f32({32, 64}, ++seed)});
    ts.push_back({"model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj.weight", make_f32({64, 32}, ++seed)});
    ts.push_back({"model.layers.0.mlp.experts." + std::to_string(e) + ".up_proj.weight_scale", make_f32({1}, ++seed)});
  }
  ts.push_back({"model.layers.0.mlp.shared_experts.gate_proj.weight", make_f32({16, 16}, ++seed)});
  ts.push_back({"model.layers.0.self_attn.q_proj.weight", make_f32({16, 16}, ++seed)});
  return ts;
}

bool overlaps(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) { return a0 < b1 && b0 < a1; }

TEST(EngineExperts, SkippedExpertBytesAreNeverRead) {
  TempDir dir;
  write_st(dir.file("moe.safetensors"), moe_tensors());
  auto sf = *SafetensorsFile::open(dir.file("moe.safetensors"));
  for (Toggle dio : {Toggle::kOff, Toggle::kOn}) {
    CountingEnv env;
    LoadOptions o;
    o.env = &env;
    o.strategy = Strategy::kStream;
    o.direct = dio;
    o.local_experts = std::set<int64_t>{1, 2};
    LoadStats st;
    auto got = load_all({dir.file("moe.safetensors")}, o, &st);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(st.skipped_tensors, 4u);  // experts 0 and 3, two weights each; scales are kept
    EXPECT_EQ(got->size(), moe_tensors().size() - 4);
    EXPECT_EQ(got->count("model.layers.0.mlp.experts.0.up_proj.weight_scale"), 1u);
    for (auto& info : sf->tensors()) {
      if (!should_skip_weight(info.name, o.local_experts)) continue;
      // O_DIRECT reads whole 4 KiB blocks: allow that slack at the edges.
      uint64_t slack = dio == Toggle::kOn ? 4096 : 0;
      uint64_t b0 = info.offset + slack, b1 = info.offset + info.nbytes - slack;
      for (auto& rd : env.reads())
        EXPECT_FALSE(b0 < b1 && overlaps(rd.offset, rd.offset + rd.len, b0, b1))
            << info.name << " read at " << rd.offset << "+" << rd.len;
    }
  }
}

TEST(EngineExperts, AllStrategiesFilter) {
  TempDir dir;
  write_st(dir.file("moe.safetensors"), moe_tensors());
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kThreads, Strategy::kStream, Strategy::kPrefetch}) {
    LoadOptions o;
    o.strategy = s;
    o.local_experts = std::set<int64_t>{3};
    auto got = load_all({dir.file("moe.safetensors")}, o);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->count("model.layers.0.mlp.experts.3.up_proj.weight"), 1u);
    EXPECT_EQ(got->count("model.layers.0.mlp.experts.2.up_proj.weight"), 0u);
    EXPECT_EQ(got->size(), moe_tensors().size() - 6);
  }
}

TEST(EngineTensorParallel, RanksReadOnlyTheirBytesAndReassemble) {
  TempDir dir;
  // 2-D row split (dim 0), 2-D column split (dim 1), 3-D split on the last dim, and a replicated bias.
  Tensor rows = make_f32({8, 6}, 1), cols = make_f32({6, 8}, 2), cube = make_f32({2, 3, 4}, 3), bias = make_f32({6}, 4);
  write_st(dir.file("tp.safetensors"),
           {{"x.row.weight", rows}, {"x.col.weight", cols}, {"x.cube", cube}, {"x.bias", bias}});
  auto sf = *SafetensorsFile::open(dir.file("tp.safetensors"));
  const int W = 2;
  std::map<std::string, std::vector<std::string>> parts;
  for (Strategy s : {Strategy::kStream, Strategy::kLazy, Strategy::kEager}) {
    parts.clear();
    for (int rank = 0; rank < W; ++rank) {
      CountingEnv env;
      LoadOptions o;
      o.env = &env;
      o.strategy = s;
      o.direct = Toggle::kOff;
      o.tp_rank = rank;
      o.tp_size = W;
      o.shard_rules = {{"*.row.weight", 0}, {"*.col.weight", 1}, {"*.cube", -1}};
      std::map<std::string, Shape> shapes;
      auto got = load_files({dir.file("tp.safetensors")}, o, [&](LoadedTensor&& t) {
        parts[t.name].push_back(std::string(reinterpret_cast<const char*>(t.view.data()), t.view.nbytes()));
        shapes[t.name] = t.view.shape();
        return Status();
      });
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      EXPECT_EQ(shapes["x.row.weight"], (Shape{4, 6}));
      EXPECT_EQ(shapes["x.col.weight"], (Shape{6, 4}));
      EXPECT_EQ(shapes["x.cube"], (Shape{2, 3, 2}));
      EXPECT_EQ(shapes["x.bias"], (Shape{6}));
      if (s != Strategy::kStream) continue;
      // Every data byte read belongs to this rank's shard (or to the replicated bias).
      std::vector<std::pair<uint64_t, uint64_t>> allowed;
      for (auto& info : sf->tensors()) {
        if (info.name == "x.bias") {
          allowed.push_back({info.offset, info.offset + info.nbytes});
          continue;
        }
        auto l = *shard_layout(info.dtype, info.shape,
                               info.name == "x.row.weight"   ? 0
                               : info.name == "x.col.weight" ? 1
                                                             : 2,
                               rank, W);
        for (uint64_t i = 0; i < l.outer; ++i) {
          uint64_t b = info.offset + l.first + i * l.stride;
          allowed.push_back({b, b + l.run});
        }
      }
      uint64_t data_read = 0;
      for (auto& rd : env.reads()) {
        if (rd.offset < sf->header().data_start) continue;  // the header
        bool inside = false;
        for (auto& [a, b] : allowed) inside |= rd.offset >= a && rd.offset + rd.len <= b;
        EXPECT_TRUE(inside) << "rank " << rank << " read " << rd.offset << "+" << rd.len;
        data_read += rd.len;
      }
      EXPECT_EQ(data_read, (rows.nbytes() + cols.nbytes() + cube.nbytes()) / W + bias.nbytes());
    }
    // Reassemble: rows concatenate; columns interleave row by row.
    auto& r = parts["x.row.weight"];
    EXPECT_EQ(r[0] + r[1], std::string(reinterpret_cast<const char*>(rows.bytes().data()), rows.nbytes()));
    auto& c = parts["x.col.weight"];
    std::string col_full;
    for (int i = 0; i < 6; ++i) col_full += c[0].substr(i * 16, 16) + c[1].substr(i * 16, 16);
    EXPECT_EQ(col_full, std::string(reinterpret_cast<const char*>(cols.bytes().data()), cols.nbytes()));
    auto& q = parts["x.cube"];
    std::string cube_full;
    for (int i = 0; i < 6; ++i) cube_full += q[0].substr(i * 8, 8) + q[1].substr(i * 8, 8);
    EXPECT_EQ(cube_full, std::string(reinterpret_cast<const char*>(cube.bytes().data()), cube.nbytes()));
  }
}

TEST(EngineTensorParallel, UnevenSplitIsAnErrorNamingTheTensor) {
  TempDir dir;
  write_st(dir.file("tp.safetensors"), {{"odd.weight", make_f32({5, 4}, 1)}});
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.tp_rank = 1;
  o.tp_size = 2;
  o.shard_rules = {{"*.weight", 0}};
  auto r = load_all({dir.file("tp.safetensors")}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("odd.weight"), std::string::npos);
  EXPECT_NE(r.status().to_string().find("does not divide into 2 shards"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace wl

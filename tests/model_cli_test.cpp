// The model-utility commands: quant-config, sparse-attention-config, remap, dummy.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "weightlift/safetensors.h"

#include <sys/stat.h>

namespace wl {
namespace {

using testing::CommandResult;
using testing::run_cli;
using testing::TempDir;
using testing::write_bytes;

TEST(QuantConfigCli, PrintsConfigAndSource) {
  TempDir dir;
  write_bytes(dir.file("config.json"), "{}");
  write_bytes(dir.file("quantize_config.json"), R"({"bits": 4})");
  auto r = run_cli({"quant-config", dir.path(), "--quantization", "gptq"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["source"], "file");
  EXPECT_EQ(j["file"], dir.file("quantize_config.json"));
  EXPECT_EQ(j["config"]["bits"], 4);

  r = run_cli({"quant-config", dir.path(), "-q", "torchao", "--hf-overrides",
               R"({"quantization_config_dict_json": "{\"_type\": \"A\"}"})"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["source"], "hf_overrides.quantization_config_dict_json");
  EXPECT_EQ(j["config"]["quant_type"]["default"]["_type"], "A");
}

TEST(QuantConfigCli, Errors) {
  TempDir dir;
  auto r = run_cli({"quant-config", dir.path(), "-q", "gptq"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "weightlift: error: " + dir.path() +
                       ": cannot find the config file for gptq (looked for *quantize_config.json among the *.json "
                       "files)\n");
  r = run_cli({"quant-config", dir.path(), "-q", "int3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("invalid quantization method: int3"), std::string::npos);
  r = run_cli({"quant-config", dir.path()});
  EXPECT_EQ(r.exit_code, 2);
  r = run_cli({"quant-config", dir.path(), "-q", "awq", "--hf-overrides", "{bad"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--hf-overrides is not valid JSON"), std::string::npos);
  r = run_cli({"quant-config", "--list-methods"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("gptq                 quantize_config.json"), std::string::npos);
}

TEST(SparseAttentionConfigCli, PrintsConfigOrEmpty) {
  TempDir dir;
  auto r = run_cli({"sparse-attention-config", dir.path()});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "{}\n");
  write_bytes(dir.file("sparse_attention_config.json"), R"({"k": 1})");
  r = run_cli({"sparse-attention-config", dir.path()});
  EXPECT_EQ(nlohmann::json::parse(r.out)["k"], 1);
}

TEST(RemapCli, KvScalesAndExperts) {
  TempDir dir;
  write_bytes(dir.file("params.txt"), "l.0.self_attn.attn.k_scale\nl.experts.routed_experts.w2_weight\n");
  auto r = run_cli({"remap", "--params", dir.file("params.txt"), "l.0.self_attn.k_proj.k_scale",
                    "l.0.self_attn.v_proj.v_scale", "l.0.mlp.weight"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "l.0.self_attn.k_proj.k_scale\tl.0.self_attn.attn.k_scale\n"
            "l.0.self_attn.v_proj.v_scale\t-\n"
            "l.0.mlp.weight\tl.0.mlp.weight\n");
  EXPECT_NE(r.err.find("weightlift: warning: found v_scale"), std::string::npos);
  r = run_cli({"remap", "--moe", "--params", dir.file("params.txt"), "l.experts.w2_weight"});
  EXPECT_EQ(r.out, "l.experts.w2_weight\tl.experts.routed_experts.w2_weight\n");
  r = run_cli({"remap", "--params", dir.file("missing.txt"), "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(dir.file("missing.txt")), std::string::npos);
}

TEST(DummyCli, SameHashAtAnyThreadCount) {
  TempDir dir;
  ASSERT_EQ(run_cli({"synth", dir.file("m"), "--size", "TINY"}).exit_code, 0);
  // And sizes that no thread count divides evenly (F32 [100003], F64 [50001], BF16 [1024, 1024]).
  {
    Tensor f32 = *Tensor::empty(DType::F32, {100003}), f64 = *Tensor::empty(DType::F64, {50001}),
           bf16 = *Tensor::empty(DType::BF16, {1024, 1024});
    std::vector<NamedTensor> ts = {{"a", f32.view()}, {"b", f64.view()}, {"c", bf16.view()}};
    ASSERT_EQ(::mkdir(dir.file("u").c_str(), 0755), 0);
    ASSERT_TRUE(write_safetensors(dir.file("u/model.safetensors"), ts).ok());
  }
  auto hash_of = [](const CommandResult& r) {
    auto at = r.out.find("sha256 ");
    return at == std::string::npos ? std::string() : r.out.substr(at + 7, 64);
  };
  std::string hash, uneven, sums;
  for (const char* threads : {"1", "2", "4", "5", "7", "8", "16"}) {
    auto r = run_cli({"dummy", dir.file("m"), "--threads", threads, "--hash"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(hash_of(r).empty()) << r.out;
    if (hash.empty()) hash = hash_of(r);
    EXPECT_EQ(hash_of(r), hash) << threads << " threads";
    auto u = run_cli({"dummy", dir.file("u"), "--threads", threads, "--hash"});
    ASSERT_EQ(u.exit_code, 0) << u.err;
    if (uneven.empty()) uneven = hash_of(u);
    EXPECT_EQ(hash_of(u), uneven) << "uneven sizes, " << threads << " threads";
    auto l = run_cli(
        {"load", dir.file("u"), "--dummy", "--threads", threads, "--checksum", "--format", "jsonl", "--no-progress"});
    ASSERT_EQ(l.exit_code, 0) << l.err;
    if (sums.empty()) sums = l.out;
    EXPECT_EQ(l.out, sums) << "load --dummy, " << threads << " threads";
  }
  auto other = run_cli({"dummy", dir.file("m"), "--seed", "7", "--hash"});
  EXPECT_EQ(other.out.find(hash), std::string::npos);
  auto bad = run_cli({"dummy", dir.file("m"), "--low", "1", "--high", "0"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("dummy weight bounds need low <= high"), std::string::npos);
  auto missing = run_cli({"dummy", dir.file("nope")});
  EXPECT_EQ(missing.exit_code, 1);
}

}  // namespace
}  // namespace wl

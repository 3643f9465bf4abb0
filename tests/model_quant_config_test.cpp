// get_quant_config / get_sparse_attention_config, branch by branch.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "weightlift/lock.h"
#include "weightlift/quant_config.h"

namespace wl {
namespace {

using nlohmann::json;
using testing::TempDir;
using testing::write_bytes;

QuantConfigRequest request(const std::string& model, const std::string& method, json hf_config = json::object()) {
  QuantConfigRequest r;
  r.model = model;
  r.quantization = method;
  r.hf_config = hf_config.dump();
  return r;
}

// The API hands JSON over as text: the results with it parsed again.
struct ParsedQuantConfig {
  json config;
  QuantConfigSource source;
  std::string file, folder;
};
Result<ParsedQuantConfig> quant_config(const QuantConfigRequest& rq) {
  WL_ASSIGN_OR_RETURN(QuantConfigResult r, get_quant_config(rq));
  return ParsedQuantConfig{json::parse(r.config), r.source, r.file, r.folder};
}
Result<json> sparse_attention_config(const std::string& model, const std::string& revision = {},
                                     const std::string& download_dir = {}, const JsonDownloader& download = {},
                                     const std::string& file_name = "sparse_attention_config.json") {
  WL_ASSIGN_OR_RETURN(std::string text,
                      get_sparse_attention_config(model, revision, download_dir, download, file_name));
  return json::parse(text);
}

TEST(QuantConfigFilenames, CommonMethods) {
  EXPECT_EQ(*quant_config_filenames("awq"), (std::vector<std::string>{"quant_config.json", "quantize_config.json"}));
  EXPECT_EQ(*quant_config_filenames("gptq"), (std::vector<std::string>{"quantize_config.json"}));
  EXPECT_EQ(*quant_config_filenames("modelopt"), (std::vector<std::string>{"hf_quant_config.json"}));
  EXPECT_TRUE(quant_config_filenames("fp8")->empty());
  EXPECT_TRUE(quant_config_filenames("compressed-tensors")->empty());
  EXPECT_TRUE(quant_config_filenames("bitsandbytes")->empty());
  auto bad = quant_config_filenames("nope");
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "invalid quantization method: nope");
}

TEST(QuantConfig, MethodIsRequiredAndMustBeKnown) {
  TempDir dir;
  auto r = quant_config(request(dir.path(), ""));
  EXPECT_EQ(r.status().message(), "the model's quantization method is not specified");
  r = quant_config(request(dir.path(), "int3"));
  EXPECT_EQ(r.status().message(), "invalid quantization method: int3");
}

TEST(QuantConfig, FromHfConfig) {
  json q = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  auto r = quant_config(request("/nonexistent", "fp8", {{"quantization_config", q}}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config, q);
  EXPECT_EQ(r->source, QuantConfigSource::kHfConfig);
}

TEST(QuantConfig, FromTextConfig) {
  json q = {{"quant_method", "awq"}, {"bits", 4}};
  auto r = quant_config(request("/nonexistent", "awq", {{"text_config", {{"quantization_config", q}}}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config, q);
  EXPECT_EQ(r->source, QuantConfigSource::kTextConfig);
  // The top-level config wins over text_config.
  json top = {{"quant_method", "awq"}, {"bits", 8}};
  r = quant_config(
      request("/nonexistent", "awq", {{"quantization_config", top}, {"text_config", {{"quantization_config", q}}}}));
  EXPECT_EQ(r->config, top);
  EXPECT_EQ(r->source, QuantConfigSource::kHfConfig);
}

TEST(QuantConfig, FromCompressionConfig) {
  json q = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}};
  auto r = quant_config(request("/nonexistent", "compressed-tensors", {{"compression_config", q}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config, q);  // no config_groups: no head counts
  EXPECT_EQ(r->source, QuantConfigSource::kCompressionConfig);
}

TEST(QuantConfig, NullQuantizationConfigCountsAsAbsent) {
  json q = {{"quant_method", "fp8"}};
  auto r = quant_config(request("/nonexistent", "fp8", {{"quantization_config", nullptr}, {"compression_config", q}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, QuantConfigSource::kCompressionConfig);
}

TEST(QuantConfig, CompressedTensorsGetsHeadCounts) {
  json q = {{"quant_method", "compressed-tensors"}, {"config_groups", json::object()}};
  auto r = quant_config(request("/nonexistent", "compressed-tensors",
                                {{"quantization_config", q}, {"num_attention_heads", 32}, {"num_key_value_heads", 8}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config["total_num_heads"], 32);
  EXPECT_EQ(r->config["total_num_kv_heads"], 8);
  // kv heads default to heads.
  r = quant_config(
      request("/nonexistent", "compressed-tensors", {{"quantization_config", q}, {"num_attention_heads", 16}}));
  EXPECT_EQ(r->config["total_num_heads"], 16);
  EXPECT_EQ(r->config["total_num_kv_heads"], 16);
  // With a text_config, the counts come from it (even if the quant config is top-level).
  r = quant_config(request("/nonexistent", "compressed-tensors",
                           {{"quantization_config", q},
                            {"num_attention_heads", 99},
                            {"text_config", {{"num_attention_heads", 40}, {"num_key_value_heads", 4}}}}));
  EXPECT_EQ(r->config["total_num_heads"], 40);
  EXPECT_EQ(r->config["total_num_kv_heads"], 4);
  // Neither known: both null.
  r = quant_config(request("/nonexistent", "compressed-tensors", {{"quantization_config", q}}));
  EXPECT_TRUE(r->config["total_num_heads"].is_null());
  EXPECT_TRUE(r->config["total_num_kv_heads"].is_null());
  // The method named in the config decides, not the requested one.
  r = quant_config(request("/nonexistent", "fp8", {{"quantization_config", q}, {"num_attention_heads", 2}}));
  EXPECT_EQ(r->config["total_num_heads"], 2);
}

TEST(QuantConfig, QuantizationConfigMustBeAnObject) {
  auto r = quant_config(request("/nonexistent", "fp8", {{"quantization_config", "fp8"}}));
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "the hf_config of the model config is not a JSON object");
}

TEST(QuantConfig, ModelOptMixedWithLayersUsesTheConfig) {
  json q = {{"quant_method", "modelopt_mixed"}, {"quantized_layers", {{"a", 1}}}};
  auto r = quant_config(request("/nonexistent", "modelopt_mixed", {{"quantization_config", q}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config, q);
}

TEST(QuantConfig, ModelOptMixedWithoutLayersFallsThroughToTheFile) {
  TempDir dir;
  json file = {{"producer", {{"name", "modelopt"}}}, {"quantization", {{"quant_algo", "MIXED_PRECISION"}}}};
  write_bytes(dir.file("hf_quant_config.json"), file.dump());
  json q = {{"quant_method", "modelopt_mixed"}};
  auto r = quant_config(request(dir.path(), "modelopt_mixed", {{"quantization_config", q}}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, QuantConfigSource::kFile);
  EXPECT_EQ(r->file, dir.file("hf_quant_config.json"));
  EXPECT_EQ(r->config, file);
}

TEST(QuantConfig, HfOverridesMustBeAnObject) {
  auto rq = request("/nonexistent", "awq");
  rq.hf_overrides = json::array().dump();
  auto r = quant_config(rq);
  EXPECT_EQ(r.status().message(), "hf_overrides must be a JSON object to look up the quantization config in it");
}

TEST(QuantConfig, OverrideFileForTorchao) {
  TempDir dir;
  write_bytes(dir.file("torchao_config.json"), R"({"_type": "Int4WeightOnlyConfig"})");
  auto rq = request(dir.path(), "torchao");
  rq.hf_overrides = json{{"quantization_config_file", dir.file("torchao_config.json")}}.dump();
  auto r = quant_config(rq);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, QuantConfigSource::kOverrideFile);
  EXPECT_EQ(r->config, (json{{"quant_type", {{"default", {{"_type", "Int4WeightOnlyConfig"}}}}}}));
  EXPECT_EQ(r->file, dir.file("torchao_config.json"));
  // A missing file names it.
  rq.hf_overrides = json{{"quantization_config_file", dir.file("missing.json")}}.dump();
  r = quant_config(rq);
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().file(), dir.file("missing.json"));
}

TEST(QuantConfig, OverrideFileForOtherMethodsIsUnimplemented) {
  auto rq = request("/nonexistent", "awq");
  rq.hf_overrides = json{{"quantization_config_file", "/x.json"}}.dump();
  auto r = quant_config(rq);
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  EXPECT_EQ(r.status().message(),
            "hf_overrides sets quantization_config_file, but the awq method cannot read a config file");
}

TEST(QuantConfig, OverrideDictJson) {
  auto rq = request("/nonexistent", "torchao");
  rq.hf_overrides = json{{"quantization_config_dict_json", R"({"_type": "X", "_data": {}})"}}.dump();
  auto r = quant_config(rq);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, QuantConfigSource::kOverrideDictJson);
  EXPECT_EQ(r->config["quant_type"]["default"]["_type"], "X");

  rq.hf_overrides = json{{"quantization_config_dict_json", "{not json"}}.dump();
  r = quant_config(rq);
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_NE(r.status().to_string().find("hf_overrides.quantization_config_dict_json: invalid JSON"), std::string::npos);

  rq.quantization = "gptq";
  rq.hf_overrides = json{{"quantization_config_dict_json", "{}"}}.dump();
  r = quant_config(rq);
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
}

TEST(QuantConfig, OnlineQuantization) {
  auto rq = request("/nonexistent", "fp8");
  rq.online_quantization = json{{"weights", "fp8"}}.dump();
  auto r = quant_config(rq);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, QuantConfigSource::kOnline);
  EXPECT_EQ(r->config, (json{{"weights", "fp8"}}));
}

TEST(QuantConfig, InflightBitsandbytes) {
  TempDir dir;
  write_bytes(dir.file("adapter_config.json"), "{}");
  auto r = quant_config(request(dir.path(), "bitsandbytes"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, QuantConfigSource::kInflightBitsandbytes);
  EXPECT_EQ(r->config, json::object());
}

TEST(QuantConfig, MethodWithoutConfigFileGetsDefaults) {
  TempDir dir;
  auto r = quant_config(request(dir.path(), "fp8"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->source, QuantConfigSource::kDefault);
  EXPECT_EQ(r->config, json::object());
  EXPECT_EQ(r->folder, dir.path());
}

TEST(QuantConfig, FindsTheMethodsFile) {
  TempDir dir;
  write_bytes(dir.file("config.json"), "{}");
  write_bytes(dir.file("quantize_config.json"), R"({"bits": 4, "group_size": 128})");
  for (const char* method : {"gptq", "awq"}) {
    auto r = quant_config(request(dir.path(), method));
    ASSERT_TRUE(r.ok()) << method << ": " << r.status().to_string();
    EXPECT_EQ(r->source, QuantConfigSource::kFile);
    EXPECT_EQ(r->file, dir.file("quantize_config.json"));
    EXPECT_EQ(r->config["bits"], 4);
  }
}

TEST(QuantConfig, FileNamesMatchBySuffixAndSkipHiddenFiles) {
  TempDir dir;
  write_bytes(dir.file("my_quant_config.json"), R"({"w_bit": 4})");       // ends with quant_config.json
  write_bytes(dir.file(".quantize_config.json"), R"({"hidden": true})");  // glob skips dot files
  auto r = quant_config(request(dir.path(), "awq"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->file, dir.file("my_quant_config.json"));
}

TEST(QuantConfig, NoConfigFileIsAnError) {
  TempDir dir;
  write_bytes(dir.file("config.json"), "{}");
  auto r = quant_config(request(dir.path(), "gptq"));
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().to_string(),
            dir.path() +
                ": cannot find the config file for gptq (looked for *quantize_config.json among the "
                "*.json files)");
}

TEST(QuantConfig, SeveralConfigFilesAreAnError) {
  TempDir dir;
  write_bytes(dir.file("quant_config.json"), "{}");
  write_bytes(dir.file("quantize_config.json"), "{}");
  auto r = quant_config(request(dir.path(), "awq"));
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "found multiple config files for awq: " + dir.file("quant_config.json") + ", " +
                                      dir.file("quantize_config.json"));
  // hf_quant_config.json also ends with quant_config.json.
  TempDir d2;
  write_bytes(d2.file("quant_config.json"), "{}");
  write_bytes(d2.file("hf_quant_config.json"), "{}");
  EXPECT_EQ(quant_config(request(d2.path(), "awq")).status().code(), Code::kInvalidArgument);
}

TEST(QuantConfig, CorruptConfigFileNamesIt) {
  TempDir dir;
  write_bytes(dir.file("quantize_config.json"), "{\"bits\": ");
  auto r = quant_config(request(dir.path(), "gptq"));
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_EQ(r.status().file(), dir.file("quantize_config.json"));
  EXPECT_NE(r.status().message().find("invalid JSON"), std::string::npos);
}

TEST(QuantConfig, ModelOptRequiresTheModelOptProducer) {
  TempDir dir;
  json good = {{"producer", {{"name", "modelopt"}, {"version", "0.19"}}}, {"quantization", {{"quant_algo", "FP8"}}}};
  write_bytes(dir.file("hf_quant_config.json"), good.dump());
  auto r = quant_config(request(dir.path(), "modelopt"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config, good);

  for (const char* bad :
       {R"({"producer": {"name": "other"}})", R"({"quantization": {}})", R"({"producer": 3})", R"([1, 2])"}) {
    write_bytes(dir.file("hf_quant_config.json"), bad);
    r = quant_config(request(dir.path(), "modelopt"));
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().to_string(), dir.file("hf_quant_config.json") +
                                          ": unsupported quantization config found for modelopt: producer.name is "
                                          "not \"modelopt\"")
        << bad;
  }
}

TEST(QuantConfig, ReadsConfigJsonFromTheLocalFolder) {
  TempDir dir;
  write_bytes(dir.file("config.json"), R"({"quantization_config": {"quant_method": "awq", "bits": 4}})");
  QuantConfigRequest rq;
  rq.model = dir.path();
  rq.quantization = "awq";
  auto r = quant_config(rq);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, QuantConfigSource::kHfConfig);
  EXPECT_EQ(r->file, dir.file("config.json"));
  EXPECT_EQ(r->config["bits"], 4);

  write_bytes(dir.file("config.json"), "[");
  r = quant_config(rq);
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_EQ(r.status().file(), dir.file("config.json"));
}

TEST(QuantConfig, RemoteModelDownloadsJsonOnceUnderTheLock) {
  TempDir cache, snapshot;
  write_bytes(snapshot.file("config.json"), "{}");
  write_bytes(snapshot.file("quantize_config.json"), R"({"bits": 8})");
  int calls = 0;
  QuantConfigRequest rq;
  rq.model = "org/remote-gptq";
  rq.quantization = "gptq";
  rq.revision = "v1";
  rq.download_dir = cache.path();
  rq.download = [&](const std::string& repo, const std::string& rev, const std::string& pattern,
                    const std::string& dir) -> Result<std::string> {
    ++calls;
    EXPECT_EQ(repo, "org/remote-gptq");
    EXPECT_EQ(rev, "v1");
    EXPECT_EQ(pattern, "*.json");
    EXPECT_EQ(dir, cache.path());
    // The model lock is held while downloading.
    CrossProcessLock probe = get_lock("org/remote-gptq", cache.path());
    EXPECT_FALSE(*probe.try_acquire());
    return snapshot.path();
  };
  auto r = quant_config(rq);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(calls, 1);  // config.json and the lookup share one download
  EXPECT_EQ(r->file, snapshot.file("quantize_config.json"));
  EXPECT_EQ(r->config["bits"], 8);
}

TEST(QuantConfig, RemoteModelWithoutDownloaderIsAnError) {
  auto r = quant_config(request("org/remote-gptq", "gptq"));
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().message(),
            "'org/remote-gptq' is not a local folder, and no downloader is configured to fetch its *.json files");
}

TEST(QuantConfig, DownloaderErrorsPropagate) {
  TempDir cache;
  auto rq = request("org/m", "gptq");
  rq.download_dir = cache.path();
  rq.download = [](const std::string&, const std::string&, const std::string&,
                   const std::string&) -> Result<std::string> { return Status::Unavailable("hub is down"); };
  EXPECT_EQ(quant_config(rq).status().message(), "hub is down");
}

TEST(SparseAttentionConfig, PresentAbsentAndRemote) {
  TempDir dir;
  auto r = sparse_attention_config(dir.path());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, json::object());
  write_bytes(dir.file("sparse_attention_config.json"), R"({"block_size": 64})");
  r = sparse_attention_config(dir.path());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["block_size"], 64);
  write_bytes(dir.file("other.json"), R"({"x": 1})");
  EXPECT_EQ((*sparse_attention_config(dir.path(), "", "", {}, "other.json"))["x"], 1);

  TempDir cache;
  int calls = 0;
  JsonDownloader fake = [&](const std::string&, const std::string&, const std::string& pattern,
                            const std::string&) -> Result<std::string> {
    ++calls;
    EXPECT_EQ(pattern, "*.json");
    return dir.path();
  };
  r = sparse_attention_config("org/sparse", "", cache.path(), fake);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ((*r)["block_size"], 64);

  write_bytes(dir.file("sparse_attention_config.json"), "nope");
  r = sparse_attention_config(dir.path());
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_EQ(r.status().file(), dir.file("sparse_attention_config.json"));
}

}  // namespace
}  // namespace wl

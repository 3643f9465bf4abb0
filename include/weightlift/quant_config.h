// weightlift/quant_config.h: quantization-config and sparse-attention-config
// resolution (vLLM weight_utils.get_quant_config / get_sparse_attention_config).
//
// The result is the JSON a quantization method's from_config() would receive,
// plus where it came from; building the method object is the engine's job.
// JSON crosses this API as text (compact, as nlohmann's dump() writes it).
// Remote models: the download of the model's "*.json" files is injected
// (JsonDownloader), so this file needs no network code and tests use a fake.
// Thread-safety: functions are reentrant; the downloader is called under the
// model's cross-process lock (weightlift/lock.h).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/status.h"

namespace wl {

// Downloads the files of `repo_id` matching `allow_pattern` ("*.json") at
// `revision` (empty: default branch) into the cache `download_dir` (empty:
// the hub's default cache) and returns the local snapshot folder.
using JsonDownloader =
    std::function<Result<std::string>(const std::string& repo_id, const std::string& revision,
                                      const std::string& allow_pattern, const std::string& download_dir)>;

// The vLLM quantization methods we know, in vLLM's order.
const std::vector<std::string>& quantization_methods();
// A method's config file names (QuantizationConfig.get_config_filenames());
// kInvalidArgument "invalid quantization method" for an unknown method.
Result<std::vector<std::string>> quant_config_filenames(std::string_view method);

struct QuantConfigRequest {
  std::string model;         // local folder or hub repo id (model_config.model)
  std::string quantization;  // the method ("awq", "fp8", ...); empty is an error
  // config.json as JSON text (model_config.hf_config). When absent it is read
  // from <model>/config.json for a local folder, or from the downloaded folder
  // for a remote model (only if the downloader is set); a missing file counts
  // as {}. Text that is not JSON is kInvalidArgument ("hf_config is not valid
  // JSON"), as for the two below.
  std::optional<std::string> hf_config;
  std::string hf_overrides = "{}";  // JSON text; must be an object
  // model_config.quantization_config (online quantization arguments) as JSON text, if set.
  std::optional<std::string> online_quantization;
  std::string revision;
  std::string download_dir;  // also the lock directory (empty: system temp dir)
  JsonDownloader download;   // needed only when `model` is not a local folder
};

enum class QuantConfigSource {
  kHfConfig,              // config.json "quantization_config"
  kTextConfig,            // config.json text_config.quantization_config
  kCompressionConfig,     // config.json "compression_config"
  kOverrideFile,          // hf_overrides.quantization_config_file (torchao)
  kOverrideDictJson,      // hf_overrides.quantization_config_dict_json (torchao)
  kOnline,                // online quantization arguments
  kInflightBitsandbytes,  // bitsandbytes without a checkpoint config: {}
  kDefault,               // the method has no config file: its defaults, {}
  kFile,                  // a config file of the model folder
};
std::string_view quant_config_source_name(QuantConfigSource s);  // "hf_config", "file", ...

struct QuantConfigResult {
  std::string config;  // JSON text: what the method's from_config() receives
  QuantConfigSource source = QuantConfigSource::kDefault;
  std::string file;    // the file read (kFile, kOverrideFile, config.json sources)
  std::string folder;  // the folder searched (kFile / kDefault after lookup)
};

// get_quant_config(), branch for branch; see docs/model.md for the order.
Result<QuantConfigResult> get_quant_config(const QuantConfigRequest& request);

// get_sparse_attention_config(): <folder>/<file_name> as JSON text (checked,
// compact), or "{}" when the file does not exist. Remote models download
// "*.json" first (under the lock).
Result<std::string> get_sparse_attention_config(const std::string& model, const std::string& revision = {},
                                                const std::string& download_dir = {},
                                                const JsonDownloader& download = {},
                                                const std::string& file_name = "sparse_attention_config.json");

}  // namespace wl

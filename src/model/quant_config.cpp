// Quantization-config and sparse-attention-config resolution (see weightlift/quant_config.h).
#include "weightlift/quant_config.h"

#include <algorithm>
#include <exception>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "weightlift/io.h"
#include "weightlift/lock.h"

namespace wl {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxJsonBytes = uint64_t{64} << 20;

// get_config_filenames() of vLLM's quantization classes (docs/model.md cites
// the sources). Order follows vLLM's QuantizationMethods, then modelopt_mixed.
const std::vector<std::pair<std::string, std::vector<std::string>>>& method_table() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> table = {
      {"awq", {"quant_config.json", "quantize_config.json"}},
      {"fp8", {}},
      {"ptpc_fp8", {}},
      {"fbgemm_fp8", {}},
      {"modelopt", {"hf_quant_config.json"}},
      {"modelopt_fp4", {"hf_quant_config.json"}},
      {"gguf", {}},
      {"gptq_marlin", {"quantize_config.json"}},
      {"awq_marlin", {"quantize_config.json"}},
      {"gptq", {"quantize_config.json"}},
      {"compressed-tensors", {}},
      {"bitsandbytes", {}},
      {"experts_int8", {}},
      {"quark", {}},
      {"moe_wna16", {"quantize_config.json"}},
      {"torchao", {}},
      {"auto-round", {"quantization_config.json"}},
      {"inc", {"quantization_config.json"}},
      {"mxfp4", {}},
      {"petit_nvfp4", {"hf_quant_config.json"}},
      {"modelopt_mixed", {"hf_quant_config.json"}},
      // vLLM 0.34's online quantization (OnlineQuantizationConfig: no config
      // file): `online` with its arguments, and the shorthands (mxfp4 above).
      {"online", {}},
      {"fp8_per_tensor", {}},
      {"fp8_per_block", {}},
      {"fp8_per_channel", {}},
      {"int8_per_channel_weight_only", {}},
      {"nvfp4_per_token", {}},
      {"mxfp8", {}},
      {"lut_b_moe", {}},
      {"mxfp4_hadamard32", {}},
  };
  return table;
}

// Only TorchAOConfig implements from_config_file / from_config_dict_json.
bool has_from_config_file(std::string_view method) { return method == "torchao"; }

Result<json> parse_json(std::string_view text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    return Status::Corrupt(fmt::format("invalid JSON: {}", e.what())).with_file(what);
  }
}

Result<json> read_json_file(const std::string& path) {
  WL_ASSIGN_OR_RETURN(std::string text, read_file_to_string(path, kMaxJsonBytes));
  return parse_json(text, path);
}

// Python's getattr(obj, key, None) on a config object given as JSON.
const json* attr(const json* obj, const char* key) {
  if (!obj || !obj->is_object()) return nullptr;
  auto it = obj->find(key);
  if (it == obj->end() || it->is_null()) return nullptr;
  return &*it;
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// The folder holding the model's JSON files: the model itself when it is a
// local folder, else the downloader's snapshot (fetched under the model lock).
Result<std::string> json_folder(const std::string& model, const std::string& revision, const std::string& download_dir,
                                const JsonDownloader& download) {
  if (Env::Default()->is_directory(model)) return model;
  if (!download)
    return Status::NotFound(
        fmt::format("'{}' is not a local folder, and no downloader is configured to fetch its *.json files", model));
  CrossProcessLock lock = get_lock(model, download_dir);
  WL_ASSIGN_OR_RETURN(LockGuard guard, LockGuard::make(lock));
  return download(model, revision, "*.json", download_dir);
}

// glob(<folder>/*.json): names ending in ".json" that do not start with '.'.
Result<std::vector<std::string>> json_files(const std::string& folder) {
  WL_ASSIGN_OR_RETURN(auto entries, Env::Default()->list_dir(folder));
  std::vector<std::string> out;
  for (const auto& e : entries)
    if (!e.name.empty() && e.name[0] != '.' && e.name.ends_with(".json")) out.push_back(join_path(folder, e.name));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

const std::vector<std::string>& quantization_methods() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [name, files] : method_table()) v.push_back(name);
    return v;
  }();
  return names;
}

Result<std::vector<std::string>> quant_config_filenames(std::string_view method) {
  for (const auto& [name, files] : method_table())
    if (name == method) return files;
  return Status::InvalidArgument(fmt::format("invalid quantization method: {}", method));
}

std::string_view quant_config_source_name(QuantConfigSource s) {
  switch (s) {
    case QuantConfigSource::kHfConfig: return "hf_config";
    case QuantConfigSource::kTextConfig: return "text_config";
    case QuantConfigSource::kCompressionConfig: return "compression_config";
    case QuantConfigSource::kOverrideFile: return "hf_overrides.quantization_config_file";
    case QuantConfigSource::kOverrideDictJson: return "hf_overrides.quantization_config_dict_json";
    case QuantConfigSource::kOnline: return "online";
    case QuantConfigSource::kInflightBitsandbytes: return "inflight_bitsandbytes";
    case QuantConfigSource::kDefault: return "default";
    case QuantConfigSource::kFile: return "file";
  }
  return "unknown";
}

namespace {

// The request's JSON texts, parsed.
struct QuantConfigInputs {
  std::optional<json> hf_config;
  json hf_overrides;
  std::optional<json> online;
};

// QuantConfigResult with the config still parsed.
struct QuantConfigFound {
  json config;
  QuantConfigSource source = QuantConfigSource::kDefault;
  std::string file, folder;
};

Result<json> parse_argument(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::InvalidArgument(std::string(what) + " is not valid JSON");
  return j;
}

// The model's JSON folder, fetched at most once (config.json and the file
// lookup share it).
class JsonFolder {
 public:
  explicit JsonFolder(const QuantConfigRequest& rq) : rq_(rq) {}
  Result<std::string> get() {
    if (!folder_) {
      WL_ASSIGN_OR_RETURN(std::string f, json_folder(rq_.model, rq_.revision, rq_.download_dir, rq_.download));
      folder_ = f;
    }
    return *folder_;
  }

 private:
  const QuantConfigRequest& rq_;
  std::optional<std::string> folder_;
};

// model_config.hf_config: the caller's, else <folder>/config.json ({} when
// there is none); *config_path gets the file it was read from.
Result<json> model_config(const QuantConfigRequest& rq, const QuantConfigInputs& in, JsonFolder& folder,
                          std::string* config_path) {
  json hf_config = json::object();
  if (in.hf_config) {
    hf_config = *in.hf_config;
  } else if (Env::Default()->is_directory(rq.model) || rq.download) {
    WL_ASSIGN_OR_RETURN(std::string f, folder.get());
    *config_path = join_path(f, "config.json");
    if (Env::Default()->exists(*config_path)) {
      WL_ASSIGN_OR_RETURN(hf_config, read_json_file(*config_path));
    }
  }
  if (!hf_config.is_object())
    return Status::InvalidArgument("the model config is not a JSON object").with_file(*config_path);
  return hf_config;
}

// The quantization config the model config carries (quantization_config,
// text_config.quantization_config or compression_config); nullopt when it
// carries none, or when the method must read its file anyway.
Result<std::optional<QuantConfigFound>> from_model_config(const QuantConfigRequest& rq, const json& hf_config,
                                                          const std::string& config_path) {
  QuantConfigFound out;
  out.file = config_path;
  const json* hf_quant = attr(&hf_config, "quantization_config");
  const json* text_config = attr(&hf_config, "text_config");
  out.source = QuantConfigSource::kHfConfig;
  if (!hf_quant && text_config) {
    hf_quant = attr(text_config, "quantization_config");
    out.source = QuantConfigSource::kTextConfig;
  }
  if (!hf_quant) {
    hf_quant = attr(&hf_config, "compression_config");
    out.source = QuantConfigSource::kCompressionConfig;
  }
  if (!hf_quant) return std::nullopt;
  if (!hf_quant->is_object())
    return Status::InvalidArgument(
               fmt::format("the {} of the model config is not a JSON object", quant_config_source_name(out.source)))
        .with_file(config_path);
  json q = *hf_quant;
  // compressed-tensors: pass the head counts for TP-aware attention-scale loading.
  auto method = q.find("quant_method");
  if (method != q.end() && *method == "compressed-tensors" && q.contains("config_groups")) {
    const json* owner = text_config ? text_config : &hf_config;
    const json* heads = attr(owner, "num_attention_heads");
    const json* kv_heads = attr(owner, "num_key_value_heads");
    q["total_num_heads"] = heads ? *heads : json(nullptr);
    q["total_num_kv_heads"] = kv_heads ? *kv_heads : (heads ? *heads : json(nullptr));
  }
  // modelopt_mixed without the per-layer map: older checkpoints keep it in
  // hf_quant_config.json only, so fall through to the file lookup.
  if (rq.quantization == "modelopt_mixed" && !q.contains("quantized_layers")) return std::nullopt;
  out.config = std::move(q);
  return out;
}

// hf_overrides.quantization_config_file / quantization_config_dict_json
// (torchao only); nullopt when neither is set.
Result<std::optional<QuantConfigFound>> from_overrides(const QuantConfigRequest& rq, const json& hf_overrides) {
  if (!hf_overrides.is_object())
    return Status::InvalidArgument("hf_overrides must be a JSON object to look up the quantization config in it");
  QuantConfigFound out;
  if (const json* file = attr(&hf_overrides, "quantization_config_file")) {
    if (!has_from_config_file(rq.quantization))
      return Status::Unimplemented(fmt::format(
          "hf_overrides sets quantization_config_file, but the {} method cannot read a config file", rq.quantization));
    if (!file->is_string())
      return Status::InvalidArgument("hf_overrides.quantization_config_file must be a path string");
    std::string path = file->get<std::string>();
    WL_ASSIGN_OR_RETURN(json parsed, read_json_file(path));
    out.config = json{{"quant_type", json{{"default", std::move(parsed)}}}};
    out.source = QuantConfigSource::kOverrideFile;
    out.file = path;
    return out;
  }
  if (const json* text = attr(&hf_overrides, "quantization_config_dict_json")) {
    if (!has_from_config_file(rq.quantization))
      return Status::Unimplemented(
          fmt::format("hf_overrides sets quantization_config_dict_json, but the {} method cannot read a config dict",
                      rq.quantization));
    if (!text->is_string())
      return Status::InvalidArgument("hf_overrides.quantization_config_dict_json must be a JSON string");
    WL_ASSIGN_OR_RETURN(json parsed,
                        parse_json(text->get<std::string>(), "hf_overrides.quantization_config_dict_json"));
    out.config = json{{"quant_type", json{{"default", std::move(parsed)}}}};
    out.source = QuantConfigSource::kOverrideDictJson;
    return out;
  }
  return std::nullopt;
}

// The method's config file in the model's folder `dir`: exactly one of the
// *.json files must end with one of `filenames` (none: the method's defaults).
Result<QuantConfigFound> from_file(const QuantConfigRequest& rq, const std::vector<std::string>& filenames,
                                   const std::string& dir) {
  QuantConfigFound out;
  out.folder = dir;
  if (filenames.empty()) {
    out.config = json::object();
    out.source = QuantConfigSource::kDefault;
    return out;
  }
  WL_ASSIGN_OR_RETURN(std::vector<std::string> candidates, json_files(dir));
  std::vector<std::string> matches;
  for (const auto& f : candidates)
    if (std::any_of(filenames.begin(), filenames.end(), [&](const std::string& n) { return f.ends_with(n); }))
      matches.push_back(f);
  if (matches.empty())
    return Status::NotFound(fmt::format("cannot find the config file for {} (looked for *{} among the *.json files)",
                                        rq.quantization, fmt::join(filenames, ", *")))
        .with_file(dir);
  if (matches.size() > 1)
    return Status::InvalidArgument(
               fmt::format("found multiple config files for {}: {}", rq.quantization, fmt::join(matches, ", ")))
        .with_file(dir);

  const std::string& path = matches[0];
  WL_ASSIGN_OR_RETURN(json config, read_json_file(path));
  out.file = path;
  out.source = QuantConfigSource::kFile;
  if (rq.quantization == "bitsandbytes") {
    // Unreachable, as in the reference: in-flight bitsandbytes returned earlier.
    if (!config.is_object()) return Status::InvalidArgument("the config file is not a JSON object").with_file(path);
    config["adapter_name_or_path"] = rq.model;
  } else if (rq.quantization == "modelopt" || rq.quantization == "modelopt_mixed") {
    const json* producer = config.is_object() ? attr(&config, "producer") : nullptr;
    const json* name = producer && producer->is_object() ? attr(producer, "name") : nullptr;
    if (!(name && *name == "modelopt"))
      return Status::InvalidArgument(
                 fmt::format("unsupported quantization config found for {}: producer.name is not \"modelopt\"",
                             rq.quantization))
          .with_file(path);
  }
  out.config = std::move(config);
  return out;
}

// The reference's lookup, first found wins: the model config, hf_overrides,
// the online arguments, in-flight bitsandbytes, the method's file.
Result<QuantConfigFound> find_quant_config(const QuantConfigRequest& rq, const QuantConfigInputs& in) {
  if (rq.quantization.empty()) return Status::InvalidArgument("the model's quantization method is not specified");
  WL_ASSIGN_OR_RETURN(std::vector<std::string> filenames, quant_config_filenames(rq.quantization));
  JsonFolder folder(rq);
  std::string config_path;
  WL_ASSIGN_OR_RETURN(json hf_config, model_config(rq, in, folder, &config_path));
  WL_ASSIGN_OR_RETURN(std::optional<QuantConfigFound> found, from_model_config(rq, hf_config, config_path));
  if (found) return std::move(*found);
  WL_ASSIGN_OR_RETURN(found, from_overrides(rq, in.hf_overrides));
  if (found) return std::move(*found);
  if (in.online) return QuantConfigFound{*in.online, QuantConfigSource::kOnline, {}, {}};
  if (rq.quantization == "bitsandbytes")
    return QuantConfigFound{json::object(), QuantConfigSource::kInflightBitsandbytes, {}, {}};
  WL_ASSIGN_OR_RETURN(std::string dir, folder.get());
  return from_file(rq, filenames, dir);
}

}  // namespace

Result<QuantConfigResult> get_quant_config(const QuantConfigRequest& rq) {
  QuantConfigInputs in;
  if (rq.hf_config) {
    WL_ASSIGN_OR_RETURN(in.hf_config, parse_argument(*rq.hf_config, "hf_config"));
  }
  WL_ASSIGN_OR_RETURN(in.hf_overrides, parse_argument(rq.hf_overrides, "hf_overrides"));
  if (rq.online_quantization) {
    WL_ASSIGN_OR_RETURN(in.online, parse_argument(*rq.online_quantization, "quantization_config"));
  }
  WL_ASSIGN_OR_RETURN(QuantConfigFound found, find_quant_config(rq, in));
  return QuantConfigResult{found.config.dump(), found.source, std::move(found.file), std::move(found.folder)};
}

Result<std::string> get_sparse_attention_config(const std::string& model, const std::string& revision,
                                                const std::string& download_dir, const JsonDownloader& download,
                                                const std::string& file_name) {
  WL_ASSIGN_OR_RETURN(std::string folder, json_folder(model, revision, download_dir, download));
  std::string path = join_path(folder, file_name);
  if (!Env::Default()->exists(path)) return std::string("{}");
  WL_ASSIGN_OR_RETURN(json config, read_json_file(path));
  return config.dump();
}

}  // namespace wl

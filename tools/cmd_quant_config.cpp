// weightlift quant-config MODEL --quantization METHOD [--hf-overrides JSON] [--online JSON]
//                                [--revision R] [--download-dir DIR] [--list-methods]
// Prints {"source", "file", "folder", "config"} as JSON: what the method's
// from_config() receives and where it came from (vLLM get_quant_config).
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "weightlift/hub.h"
#include "weightlift/quant_config.h"

namespace wl::cli {
namespace {

struct QuantConfigArgs {
  std::string model;
  std::string quantization;
  std::string hf_overrides;
  std::string online;
  std::string revision;
  std::string download_dir;
  bool list = false;
};

int run_quant_config(const QuantConfigArgs& a) {
  if (a.list) {
    for (const auto& m : quantization_methods()) {
      auto files = quant_config_filenames(m);
      std::printf("%-20s %s\n", m.c_str(),
                  files->empty() ? "(defaults)" : fmt::format("{}", fmt::join(*files, " ")).c_str());
    }
    return 0;
  }
  if (a.model.empty()) return usage_error("quant-config: MODEL is required");
  if (a.quantization.empty()) return usage_error("quant-config: --quantization METHOD is required");
  QuantConfigRequest rq;
  rq.model = a.model;
  rq.quantization = a.quantization;
  rq.revision = a.revision;
  rq.download_dir = a.download_dir;
  // Remote models: the Hub client fetches the *.json files (cache = --download-dir).
  rq.download = [](const std::string& repo, const std::string& revision, const std::string& pattern,
                   const std::string& dir) { return download_config_files(repo, revision, pattern, dir); };
  auto valid = [](const std::string& text, const char* flag) -> bool {
    try {
      [[maybe_unused]] auto parsed = nlohmann::json::parse(text);
      return true;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "weightlift: error: %s is not valid JSON: %s\n", flag, inert(e.what()).c_str());
      return false;
    }
  };
  if (!a.hf_overrides.empty()) {
    if (!valid(a.hf_overrides, "--hf-overrides")) return 2;
    rq.hf_overrides = a.hf_overrides;
  }
  if (!a.online.empty()) {
    if (!valid(a.online, "--online")) return 2;
    rq.online_quantization = a.online;
  }
  auto r = get_quant_config(rq);
  if (!r.ok()) return fail(r.status());
  nlohmann::ordered_json out;
  out["source"] = quant_config_source_name(r->source);
  out["file"] = r->file.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r->file);
  out["folder"] = r->folder.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r->folder);
  out["config"] = nlohmann::ordered_json::parse(r->config);
  std::printf("%s\n", out.dump(2, ' ', /*ensure_ascii=*/true).c_str());  // the file's text, inert on a terminal
  return 0;
}

RunFn setup_quant_config(CLI::App& sub) {
  auto a = std::make_shared<QuantConfigArgs>();
  sub.add_option("model", a->model, "model folder or Hugging Face Hub repo id");
  sub.add_option("--quantization,-q", a->quantization, "quantization method (awq, gptq, fp8, modelopt, ...)");
  sub.add_option("--hf-overrides", a->hf_overrides, "JSON object (quantization_config_file / _dict_json)");
  sub.add_option("--online", a->online, "online quantization arguments (JSON)");
  sub.add_option("--revision", a->revision, "hub revision");
  sub.add_option("--download-dir", a->download_dir, "download cache (also where the lock lives)");
  sub.add_flag("--list-methods", a->list, "list the known methods and their config file names");
  return [a] { return run_quant_config(*a); };
}

Register reg("quant-config", "Resolve a model's quantization config (vLLM get_quant_config)", setup_quant_config);

}  // namespace
}  // namespace wl::cli

// weightlift sparse-attention-config MODEL [--file NAME] [--revision R] [--download-dir DIR]
// Prints the model's sparse_attention_config.json, or {} when it has none.
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "command.h"
#include "weightlift/hub.h"
#include "weightlift/quant_config.h"

namespace wl::cli {
namespace {

struct SparseArgs {
  std::string model;
  std::string file = "sparse_attention_config.json";
  std::string revision;
  std::string download_dir;
};

RunFn setup_sparse(CLI::App& sub) {
  auto a = std::make_shared<SparseArgs>();
  sub.add_option("model", a->model, "model folder or Hugging Face Hub repo id")->required();
  sub.add_option("--file", a->file, "config file name");
  sub.add_option("--revision", a->revision, "hub revision");
  sub.add_option("--download-dir", a->download_dir, "download cache (also where the lock lives)");
  return [a] {
    JsonDownloader download = [](const std::string& repo, const std::string& revision, const std::string& pattern,
                                 const std::string& dir) {
      return download_config_files(repo, revision, pattern, dir);
    };
    auto r = get_sparse_attention_config(a->model, a->revision, a->download_dir, download, a->file);
    if (!r.ok()) return fail(r.status());
    std::printf("%s\n", nlohmann::json::parse(*r).dump(2, ' ', /*ensure_ascii=*/true).c_str());  // inert on a terminal
    return 0;
  };
}

Register reg("sparse-attention-config", "Print a model's sparse attention config ({} when absent)", setup_sparse);

}  // namespace
}  // namespace wl::cli

// weightlift sparse-attention-config MODEL [--file NAME]
// Prints the model's sparse_attention_config.json, or {} when it has none.
#include <cstdio>
#include <memory>

#include "command.h"
#include "weightlift/quant_config.h"

namespace wl::cli {
namespace {

struct SparseArgs {
  std::string model;
  std::string file = "sparse_attention_config.json";
};

RunFn setup_sparse(CLI::App& sub) {
  auto a = std::make_shared<SparseArgs>();
  sub.add_option("model", a->model, "model folder")->required();
  sub.add_option("--file", a->file, "config file name");
  return [a] {
    auto r = get_sparse_attention_config(a->model, "", "", {}, a->file);
    if (!r.ok()) return fail(r.status());
    std::printf("%s\n", r->dump(2).c_str());
    return 0;
  };
}

Register reg("sparse-attention-config", "Print a model's sparse attention config ({} when absent)", setup_sparse);

}  // namespace
}  // namespace wl::cli

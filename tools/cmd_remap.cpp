// weightlift remap --params FILE [--moe] NAME...
// Remaps checkpoint names to model parameter names (vLLM
// maybe_remap_kv_scale_name, or maybe_remap_moe_expert_param_name with
// --moe). FILE lists the model's parameter names, one a line. Prints
// "NAME<TAB>REMAPPED" per name; REMAPPED is "-" when the weight is dropped.
#include <cstdio>
#include <memory>
#include <sstream>

#include "command.h"
#include "weightlift/io.h"
#include "weightlift/remap.h"

namespace wl::cli {
namespace {

struct RemapArgs {
  std::string params_file;
  std::vector<std::string> names;
  bool moe = false;
};

int run_remap(const RemapArgs& a) {
  auto text = read_file_to_string(a.params_file, uint64_t{256} << 20);
  if (!text.ok()) return fail(text.status());
  ParamNames params;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) params.insert(line);
  }
  std::string out;  // NAME TAB REMAPPED, each made inert (text.h): names may come from a file
  for (const auto& n : a.names) {
    if (a.moe) {
      out += inert(n) + "\t" + inert(maybe_remap_moe_expert_param_name(n, params)) + "\n";
    } else {
      auto r = maybe_remap_kv_scale_name(n, params);
      out += inert(n) + "\t" + (r ? inert(*r) : std::string("-")) + "\n";
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

RunFn setup_remap(CLI::App& sub) {
  auto a = std::make_shared<RemapArgs>();
  sub.add_option("--params", a->params_file, "file with the model's parameter names, one a line")->required();
  sub.add_flag("--moe", a->moe, "MoE expert names (routed_experts) instead of k/v scales");
  sub.add_option("names", a->names, "checkpoint tensor names")->required();
  return [a] { return run_remap(*a); };
}

Register reg("remap", "Remap checkpoint names to model parameter names (k/v scales, MoE experts)", setup_remap);

}  // namespace
}  // namespace wl::cli

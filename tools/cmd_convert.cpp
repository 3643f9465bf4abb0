// weightlift convert IN [OUT] [--no-verify]
#include <cstdio>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "weightlift/convert.h"
#include "weightlift/io.h"

namespace wl::cli {
namespace {

struct ConvertArgs {
  std::string input;
  std::string output;
  bool no_verify = false;
};

int run_convert(const ConvertArgs& a) {
  ConvertOptions o;
  o.verify = !a.no_verify;
  Env* env = Env::Default();
  Result<ConvertResult> r = Status::Internal("unset");
  if (env->is_directory(a.input)) {
    r = convert_pytorch_folder(a.input, a.output.empty() ? a.input : a.output, o, env);
  } else {
    if (!env->exists(a.input)) return fail(Status::NotFound("no such file or folder").with_file(a.input));
    std::string out = a.output;
    if (out.empty()) {
      std::filesystem::path p(a.input);
      out = (p.parent_path() / safetensors_name_for(p.filename().string())).string();
    } else if (env->is_directory(out)) {
      out = (std::filesystem::path(out) / safetensors_name_for(std::filesystem::path(a.input).filename().string()))
                .string();
    }
    r = convert_pytorch_to_safetensors(a.input, out, o, env);
  }
  if (!r.ok()) return fail(r.status());
  for (auto& f : r->outputs) std::printf("%s\n", f.c_str());
  std::fprintf(stderr, "converted %llu tensors (%llu bytes in, %llu bytes out)%s\n",
               static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->input_bytes),
               static_cast<unsigned long long>(r->output_bytes), o.verify ? ", verified" : "");
  if (!r->dropped.empty())
    std::fprintf(stderr, "dropped %zu names that share storage with an earlier tensor: %s\n", r->dropped.size(),
                 inert(fmt::format("{}", fmt::join(r->dropped, ", "))).c_str());
  return 0;
}

RunFn setup_convert(CLI::App& sub) {
  auto a = std::make_shared<ConvertArgs>();
  sub.add_option("input", a->input, "a PyTorch .bin/.pt file, or a model folder of them")->required();
  sub.add_option("output", a->output,
                 "output .safetensors file or folder (default: beside the input, pytorch_model -> model)");
  sub.add_flag("--no-verify", a->no_verify, "skip reading every tensor back from the written file");
  return [a] { return run_convert(*a); };
}

Register reg("convert", "Convert PyTorch .bin/.pt weights (a file or a folder) to safetensors", setup_convert);

}  // namespace
}  // namespace wl::cli

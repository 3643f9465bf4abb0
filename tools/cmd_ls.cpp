// weightlift ls PATH... [--format table|jsonl]
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "weightlift/checkpoint.h"
#include "weightlift/hub.h"
#include "weightlift/weight_files.h"

namespace wl::cli {
namespace {

struct LsArgs {
  std::vector<std::string> paths;
  std::string format = "table";
  std::string revision = "main";
  bool offline = false;
  NetworkFlags net;
};

int run_ls(const LsArgs& a) {
  auto net = apply_network_flags(a.net);
  if (!net.ok()) return usage_error(net.status().message());
  auto resolved = weight_files_of(a.paths, a.revision, a.offline);
  if (!resolved.ok()) return fail(resolved.status());
  const std::vector<std::string>& files = *resolved;
  std::string out;
  if (a.format == "table")
    out +=
        fmt::format("{:<56} {:<8} {:<20} {:<40} {:>12} {:>12}\n", "NAME", "DTYPE", "SHAPE", "FILE", "OFFSET", "BYTES");
  for (auto& f : files) {
    auto ck = open_checkpoint(f);
    if (!ck.ok()) return fail(ck.status());
    for (auto& t : (*ck)->tensors()) {
      if (a.format == "jsonl") {
        nlohmann::ordered_json j = {
            {"name", t.name},
            {"dtype", dtype_name(t.dtype)},
            {"shape", t.shape},
            {"file", redact_secrets(f)},
            {"offset", t.file_offset ? nlohmann::ordered_json(*t.file_offset) : nlohmann::ordered_json()},
            {"bytes", t.nbytes}};
        out += json_line(j);
      } else {
        out += fmt::format("{:<56} {:<8} {:<20} {:<40} {:>12} {:>12}\n", inert(t.name), dtype_name(t.dtype),
                           shape_to_string(t.shape), inert(f), t.file_offset ? std::to_string(*t.file_offset) : "-",
                           t.nbytes);
      }
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

RunFn setup_ls(CLI::App& sub) {
  auto a = std::make_shared<LsArgs>();
  sub.add_option("paths", a->paths, "weight files or model folders")->required();
  sub.add_option("--format", a->format, "output format")->check(CLI::IsMember({"table", "jsonl"}));
  sub.add_option("--revision", a->revision, "Hub revision when PATH is a repository id");
  sub.add_flag("--offline", a->offline, "resolve repository ids from the local Hub cache only");
  add_network_flags(sub, a->net);
  return [a] { return run_ls(*a); };
}

Register reg("ls", "List the tensors of weight files: name, dtype, shape, file, offset, bytes", setup_ls);

}  // namespace
}  // namespace wl::cli

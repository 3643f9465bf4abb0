// weightlift load PATH... [--strategy S] [--checksum] [--format table|jsonl]
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "weightlift/hash.h"
#include "weightlift/loader.h"
#include "weightlift/progress.h"
#include "weightlift/weight_files.h"

namespace wl::cli {
namespace {

struct LoadArgs {
  std::vector<std::string> paths;
  std::string strategy = "lazy";
  std::string format = "table";
  bool checksum = false;
  bool no_progress = false;
};

int run_load(const LoadArgs& a) {
  auto strategy = strategy_from_name(a.strategy);
  if (!strategy) return usage_error(fmt::format("unknown strategy '{}'", a.strategy));
  std::vector<std::string> files;
  for (auto& p : a.paths) {
    auto wf = find_weight_files(p);
    if (!wf.ok()) return fail(wf.status());
    if (wf->format != WeightFormat::kSafetensors)
      return fail(Status::Unimplemented("only safetensors files are supported by this build").with_file(p));
    files.insert(files.end(), wf->files.begin(), wf->files.end());
  }
  LoadOptions opt;
  opt.strategy = *strategy;
  std::unique_ptr<ProgressBar> bar;
  if (!a.no_progress) {
    opt.progress = [&bar](const LoadProgress& p) {
      if (!bar) bar = std::make_unique<ProgressBar>("Loading safetensors checkpoint shards", p.bytes_total, true, stderr, "B");
      bar->update(p.bytes_done);
      return true;
    };
  }
  std::vector<LoadedTensor> kept;  // the load's result: every tensor stays in memory until the end
  std::string out;
  auto r = load_files(files, opt, [&](LoadedTensor&& t) {
    if (a.checksum) {
      nlohmann::ordered_json j = {{"name", t.name},
                                  {"dtype", dtype_name(t.view.dtype())},
                                  {"shape", t.view.shape()},
                                  {"sha256", sha256_hex(t.view.bytes())}};
      if (a.format == "jsonl") out += j.dump() + "\n";
      else out += fmt::format("{:<56} {:<6} {:<20} {}\n", t.name, dtype_name(t.view.dtype()),
                              shape_to_string(t.view.shape()), j["sha256"].get<std::string>());
    }
    kept.push_back(std::move(t));
    return Status();
  });
  if (!r.ok()) return fail(r.status());
  if (bar) bar->finish();
  std::fwrite(out.data(), 1, out.size(), stdout);
  double gbps = r->seconds > 0 ? static_cast<double>(r->bytes) / r->seconds / 1e9 : 0.0;
  std::fprintf(stderr, "loaded %llu tensors, %llu bytes from %zu files in %.3f s (%.2f GB/s), strategy %s, peak RSS %.1f MiB\n",
               static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->bytes), files.size(),
               r->seconds, gbps, std::string(strategy_name(*strategy)).c_str(),
               static_cast<double>(peak_rss_bytes()) / (1 << 20));
  return 0;
}

RunFn setup_load(CLI::App& sub) {
  auto a = std::make_shared<LoadArgs>();
  sub.add_option("paths", a->paths, "weight files or model folders")->required();
  sub.add_option("--strategy", a->strategy, "lazy | eager");
  sub.add_flag("--checksum", a->checksum, "print the SHA-256 of every tensor's bytes");
  sub.add_option("--format", a->format, "output format of --checksum")->check(CLI::IsMember({"table", "jsonl"}));
  sub.add_flag("--no-progress", a->no_progress, "no progress bar");
  return [a] { return run_load(*a); };
}

Register reg("load", "Load every tensor into host memory and report speed and memory", setup_load);

}  // namespace
}  // namespace wl::cli

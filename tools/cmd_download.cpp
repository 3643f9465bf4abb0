// weightlift download REPO [--revision R] [--include P]... [--exclude P]...
//                          [--cache-dir D] [--offline] [--token T]
// Downloads into the Hugging Face cache (shared with huggingface_hub) and
// prints the snapshot folder.
// weightlift download s3://bucket/prefix/ DIR [--configs] [--connections N] [--chunk SIZE]
// Copies the model's weight files (and with --configs its *.json and
// tokenizer files) from object storage into DIR and prints DIR.
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/progress.h"
#include "weightlift/s3.h"
#include "weightlift/synth.h"  // parse_size

namespace wl::cli {
namespace {

struct DownloadArgs {
  std::string repo;
  std::string dir;  // URL sources only
  bool configs = false;
  std::string revision = "main";
  std::vector<std::string> include, exclude;
  std::string cache_dir;
  std::string token;
  bool token_set = false;
  bool offline = false;
  bool quiet = false;
  int workers = 8;
  int connections = 8;
  std::string split_min = "64MB";
  std::string chunk = "16MB";
  NetworkFlags net;
};

// An object-storage (or any URL) source: the chosen files into a local folder.
int run_url_download(const DownloadArgs& a) {
  if (a.dir.empty()) return usage_error("download of a URL needs a destination folder: download URL DIR");
  ModelDownloadOptions o;
  o.configs = a.configs;
  o.threads = a.connections;
  auto chunk = parse_size(a.chunk);
  if (!chunk.ok()) return usage_error(chunk.status().message());
  o.chunk_bytes = *chunk;
  std::unique_ptr<ProgressBar> bar;
  if (!a.quiet)
    o.progress = [&bar](uint64_t done, uint64_t total) {
      if (!bar) bar = std::make_unique<ProgressBar>("Downloading", total, true, stderr, "B");
      bar->update(done);
    };
  auto r = download_model_files(a.repo, a.dir, o);
  if (!r.ok()) return fail(r.status());
  if (bar) bar->finish();
  if (!a.quiet) {
    std::fprintf(stderr, "weightlift: wrote %zu files, %llu bytes\n", r->files.size(),
                 static_cast<unsigned long long>(r->bytes));
    if (!r->left_out.empty()) {  // never a silent skip: say what else is there
      std::string some;
      for (size_t i = 0; i < r->left_out.size() && i < 5; ++i) some += (i ? ", " : "") + r->left_out[i];
      if (r->left_out.size() > 5) some += fmt::format(", ... ({} more)", r->left_out.size() - 5);
      std::fprintf(stderr, "weightlift: left out %zu other file%s under %s (not weights%s): %s\n", r->left_out.size(),
                   r->left_out.size() == 1 ? "" : "s", inert(a.repo).c_str(),
                   a.configs ? " or configs" : "; --configs adds configs", inert(some).c_str());
    }
  }
  if (!r->unverified.empty()) {  // said even with -q: the integrity rule's exception (docs/integrity.md)
    std::string some;
    for (size_t i = 0; i < r->unverified.size() && i < 5; ++i) some += (i ? ", " : "") + base_name(r->unverified[i]);
    if (r->unverified.size() > 5) some += fmt::format(", ... ({} more)", r->unverified.size() - 5);
    std::fprintf(stderr, "weightlift: %zu file%s NOT verified (the source vouches for no hash of %s): %s\n",
                 r->unverified.size(), r->unverified.size() == 1 ? "" : "s", r->unverified.size() == 1 ? "it" : "them",
                 inert(some).c_str());
  }
  std::printf("%s\n", a.dir.c_str());
  return 0;
}

int run_download(const DownloadArgs& a) {
  auto net = apply_network_flags(a.net);
  if (!net.ok()) return usage_error(net.status().message());
  if (is_url(a.repo)) return run_url_download(a);
  if (!a.dir.empty())
    return usage_error(
        "DIR is for s3://, gs:// and http(s):// sources; a Hub repository goes to the cache (--cache-dir)");
  if (a.configs) return usage_error("--configs is for s3:// and gs:// sources; use --include for a Hub repository");
  HubOptions o;
  o.cache_dir = a.cache_dir;
  if (a.token_set) o.token = a.token;
  if (a.offline) o.offline = true;
  o.max_workers = a.workers;
  o.connections_per_file = a.connections;
  o.progress = !a.quiet;
  auto split = parse_size(a.split_min);
  if (!split.ok()) return usage_error(split.status().message());
  auto chunk = parse_size(a.chunk);
  if (!chunk.ok()) return usage_error(chunk.status().message());
  o.parallel_min_bytes = *split;
  o.chunk_bytes = *chunk;
  o.log = [quiet = a.quiet](const std::string& line) {  // -q keeps the warnings
    if (!quiet || line.starts_with("warning: ")) std::fprintf(stderr, "weightlift: %s\n", inert(line).c_str());
  };
  SnapshotOptions s;
  s.revision = a.revision;
  s.allow_patterns = a.include;
  s.ignore_patterns = a.exclude;
  auto r = use_modelscope() ? modelscope_snapshot_download(a.repo, s, o) : snapshot_download(a.repo, s, o);
  if (!r.ok()) return fail(r.status());
  std::printf("%s\n", r->c_str());
  return 0;
}

RunFn setup_download(CLI::App& sub) {
  auto a = std::make_shared<DownloadArgs>();
  sub.add_option("repo", a->repo, "repository id (org/name), or an s3:// or gs:// model prefix")->required();
  sub.add_option("dir", a->dir, "destination folder (object-storage sources)");
  sub.add_flag("--configs", a->configs, "object storage: also *.json, tokenizer and *.py files, as vLLM pulls them");
  sub.add_option("--revision", a->revision, "branch, tag or commit (default main)");
  sub.add_option("--include", a->include, "only files matching this fnmatch pattern (repeatable)");
  sub.add_option("--exclude", a->exclude, "skip files matching this fnmatch pattern (repeatable)");
  sub.add_option("--cache-dir", a->cache_dir, "cache folder (default: $HF_HUB_CACHE or ~/.cache/huggingface/hub)");
  sub.add_flag("--offline", a->offline, "never touch the network; resolve from the cache");
  auto* tok = sub.add_option("--token", a->token, "Hub token (default: $HF_TOKEN or the token file)");
  sub.add_flag("-q,--quiet", a->quiet, "no progress bar");
  sub.add_option("--workers", a->workers, "files downloaded at once")->check(CLI::Range(1, 64));
  sub.add_option("--connections", a->connections, "parallel ranged requests per large file")->check(CLI::Range(1, 64));
  sub.add_option("--split-min", a->split_min, "files at least this large use parallel ranged requests (default 64MB)");
  sub.add_option("--chunk", a->chunk, "size of one ranged request (default 16MB, at least 1MB)");
  add_network_flags(sub, a->net);
  return [a, tok] {
    a->token_set = tok->count() > 0;
    return run_download(*a);
  };
}

Register reg("download",
             "Download a Hub repository into the Hugging Face cache and print its snapshot folder, or copy a model "
             "out of object storage (s3://, gs://) into DIR",
             setup_download);

}  // namespace
}  // namespace wl::cli

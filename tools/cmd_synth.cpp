// weightlift synth DIR [--size SMALL|1GB|...] [--seed N]
#include <cstdio>
#include <memory>

#include "command.h"
#include "weightlift/synth.h"

namespace wl::cli {
namespace {

struct SynthArgs {
  std::string dir;
  std::string size = "SMALL";
  uint64_t seed = 0;
  int shards = 2;
};

int run_synth(const SynthArgs& a) {
  auto size = parse_size(a.size);
  if (!size.ok()) return usage_error(size.status().message());
  SynthOptions o;
  o.target_bytes = *size;
  o.seed = a.seed;
  o.min_shards = a.shards;
  auto r = synth_model(a.dir, o);
  if (!r.ok()) return fail(r.status());
  std::fprintf(stderr, "wrote %s: %llu tensors, %llu bytes in %d shards (%d layers, hidden %d)\n", a.dir.c_str(),
               static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->bytes), r->shards,
               r->layers, r->hidden);
  return 0;
}

RunFn setup_synth(CLI::App& sub) {
  auto a = std::make_shared<SynthArgs>();
  sub.add_option("dir", a->dir, "output model folder")->required();
  sub.add_option("--size", a->size, "TINY, SMALL (default), MEDIUM or a size like 1GB, 512MB");
  sub.add_option("--seed", a->seed, "seed of the deterministic contents");
  sub.add_option("--shards", a->shards, "at least this many shards")->check(CLI::Range(1, 10000));
  return [a] { return run_synth(*a); };
}

Register reg("synth", "Write a deterministic Llama-shaped Hugging Face model folder", setup_synth);

}  // namespace
}  // namespace wl::cli

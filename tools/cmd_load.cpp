// weightlift load PATH... [--strategy S] [--checksum] [--format table|jsonl]
//   [--threads N] [--block-size BYTES] [--tp-rank R --tp-size W] [--shard-rule PATTERN:DIM ...]
//   [--experts IDS] [--max-memory BYTES] [--direct auto|on|off] [--no-progress] [--into-preallocated]
//   [--device cpu|pinned|cuda[:N]] [--gds auto|on|off]
//   [--distributed [--dist-timeout SECONDS]]   (under mpirun: read once in total, exchange over MPI)
// With a device, tensors land in pinned or CUDA memory (weightlift/gpu.h);
// --checksum then copies each one back to hash it. The command only turns
// flags into LoadOptions and prints what came back: how the load reads is the
// engine's plan (load_plan.h), which --verbose prints as the engine made it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "command.h"
#include "weightlift/checkpoint.h"
#include "weightlift/destination.h"
#include "weightlift/dummy.h"
#include "weightlift/expert_filter.h"
#include "weightlift/gpu.h"
#include "weightlift/hash.h"
#include "weightlift/hub.h"
#include "weightlift/loader.h"
#include "weightlift/progress.h"
#include "weightlift/read_path.h"
#include "weightlift/synth.h"
#include "weightlift/weight_files.h"

namespace wl::cli {
namespace {

struct LoadArgs {
  std::vector<std::string> paths;
  std::string strategy = "auto";
  std::string format = "table";
  bool checksum = false;
  bool no_progress = false;
  bool verbose = false;
  int threads = 0;
  std::string block_size;
  int64_t tp_rank = 0, tp_size = 1;
  int rank = 0, world_size = 1;
  std::vector<std::string> shard_rules;
  std::string experts;
  std::string max_memory;
  std::string direct = "auto";
  std::string revision = "main";
  bool offline = false;
  bool dummy = false;
  uint64_t dummy_seed = 1234;
  std::string device = "cpu";
  std::string gds = "auto";
  bool distributed = false;
  double dist_timeout = 600;
  bool preallocated = false;
  NetworkFlags net;
};

// --into-preallocated: one host buffer per tensor allocated and touched
// before the load (as a framework's parameters are), then the engine reads
// into them (a caller destination): the load-into-destinations path.
struct Preallocated {
  std::unordered_map<std::string, Buffer> buffers;
  std::unique_ptr<Destination> dest;
};
Result<std::unique_ptr<Preallocated>> preallocate(const std::vector<std::string>& files) {
  auto p = std::make_unique<Preallocated>();
  for (const auto& f : files) {
    WL_ASSIGN_OR_RETURN(auto ck, open_checkpoint(f));
    for (const auto& t : ck->tensors()) {
      WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(t.nbytes)), .tensor = t.name, .file = f);
      if (t.nbytes) std::memset(b.data(), 0, b.size());
      p->buffers[t.name] = std::move(b);
    }
  }
  p->dest = caller_destination([m = p.get()](const TensorRequest& r) -> Result<Region> {
    auto it = m->buffers.find(r.name);
    if (it == m->buffers.end()) return Status::Internal("no preallocated buffer").with_tensor(r.name);
    return Region{it->second.data(), it->second.size(), kCpu, nullptr};
  });
  return p;
}

// --dummy: every tensor allocated and filled with reproducible random values
// (weightlift/dummy.h); only the headers are read, never the tensors' bytes.
Result<LoadStats> load_dummy(const std::vector<std::string>& files, uint64_t seed, int threads,
                             const std::function<Status(LoadedTensor&&)>& sink) {
  auto t0 = std::chrono::steady_clock::now();
  LoadStats st;
  uint64_t ordinal = 0;
  for (const auto& f : files) {
    WL_ASSIGN_OR_RETURN(auto ck, open_checkpoint(f));
    for (const auto& t : ck->tensors()) {
      DummyOptions o;
      o.seed = seed;
      o.threads = threads;
      WL_ASSIGN_OR_RETURN(Tensor host, dummy_tensor(t.dtype, t.shape, o), .tensor = t.name, .file = f);
      LoadedTensor lt;
      lt.name = t.name;
      lt.file = f;
      lt.ordinal = ordinal++;
      lt.view = host.view();
      st.tensors++;
      st.bytes += t.nbytes;
      WL_RETURN_IF_ERROR(sink(std::move(lt)));
    }
  }
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

// What a load needs from the command line, and what keeps it alive: the
// engine's options, the destination and collective they point at, the
// sources of repositories that load while they download, the files.
struct Setup {
  LoadOptions opt;
  Device device = kCpu;
  std::unique_ptr<gpu::DeviceDestination> dest;     // --device pinned / cuda
  std::unique_ptr<Collective> world;                // --distributed
  std::vector<std::unique_ptr<HubSource>> sources;  // repository ids served while they download
  std::unique_ptr<Preallocated> pre;                // --into-preallocated
  std::vector<std::string> files;
};

// The engine's options of the flags (the read wishes as given: the engine
// decides); a usage error's exit code otherwise.
std::optional<int> read_flags(const LoadArgs& a, LoadOptions& opt) {
  auto strategy = strategy_from_name(a.strategy);
  if (!strategy) return usage_error(fmt::format("unknown strategy '{}'", a.strategy));
  opt.strategy = *strategy;
  if (a.threads < 0) return usage_error(fmt::format("--threads {} is negative", a.threads));
  opt.threads = a.threads;
  if (!a.block_size.empty()) {
    auto n = parse_size(a.block_size);
    if (!n.ok() || *n == 0) return usage_error(fmt::format("bad --block-size '{}'", a.block_size));
    opt.block_size = *n;
  }
  if (!a.max_memory.empty()) {
    auto n = parse_size(a.max_memory);
    if (!n.ok() || *n == 0) return usage_error(fmt::format("bad --max-memory '{}'", a.max_memory));
    opt.max_memory = *n;
  }
  if (a.tp_size < 1 || a.tp_rank < 0 || a.tp_rank >= a.tp_size)
    return usage_error(fmt::format("--tp-rank {} is outside [0, --tp-size {})", a.tp_rank, a.tp_size));
  if (a.world_size < 1 || a.rank < 0 || a.rank >= a.world_size)
    return usage_error(fmt::format("--rank {} is outside [0, --world-size {})", a.rank, a.world_size));
  opt.tp_rank = a.tp_rank;
  opt.tp_size = a.tp_size;
  opt.rank = a.rank;
  opt.world_size = a.world_size;
  for (auto& r : a.shard_rules) {
    auto rule = parse_shard_rule(r);
    if (!rule.ok()) return usage_error(rule.status().message());
    opt.shard_rules.push_back(*rule);
  }
  if (!a.experts.empty()) {
    auto ids = parse_expert_id_list(a.experts);
    if (!ids.ok()) return usage_error(ids.status().message());
    opt.local_experts = *ids;
  }
  opt.direct = toggle_from_name(a.direct).value_or(Toggle::kAuto);
  return std::nullopt;
}

// Where the tensors land (gpu::destination_for: host memory of the engine's
// choosing, pinned or CUDA) and, with --distributed, the ranks of
// MPI_COMM_WORLD (mpirun -np N) that read the checkpoint once in total.
std::optional<int> open_destination(const LoadArgs& a, Setup& s) {
  auto device = parse_device(a.device);
  if (!device.ok()) return usage_error(device.status().message());
  s.device = *device;
  // Context, pinned ring and copier on a background thread while the files
  // are resolved and planned (what the first device load of a process pays).
  if (!a.dummy) gpu::warm_up(s.device);
  auto gds = toggle_from_name(a.gds);
  if (!gds) return usage_error(fmt::format("bad --gds '{}' (expected auto, on or off)", a.gds));
  if (a.dummy && s.device.kind != DeviceKind::kCpu) return usage_error("--dummy fills host memory; drop --device");
  auto dest = gpu::destination_for(s.device, {.gds = *gds});
  if (!dest.ok()) return fail(dest.status());
  s.dest = std::move(*dest);
  s.opt.destination = s.dest.get();
  if (!a.distributed) return std::nullopt;
  if (a.dummy) return usage_error("--distributed reads the checkpoint; it does not combine with --dummy");
  if (a.rank != 0 || a.world_size != 1)
    return usage_error("--distributed takes the rank and world size from MPI; drop --rank and --world-size");
  if (!(a.dist_timeout > 0 && a.dist_timeout <= 86400))
    return usage_error(fmt::format("--dist-timeout {} is outside (0, 86400] seconds", a.dist_timeout));
  auto w = mpi_world(std::chrono::milliseconds(static_cast<int64_t>(a.dist_timeout * 1000)));
  if (!w.ok()) return fail(w.status());
  s.world = std::move(*w);
  s.opt.collective = s.world.get();
  return std::nullopt;
}

// The weight files (every rank learns whether every rank found its files);
// a repository id on a cold cache loads while it downloads (its sources
// serve the files meanwhile, and the engine reads them as files still
// arriving). With --into-preallocated, their buffers.
std::optional<int> resolve_files(const LoadArgs& a, Setup& s) {
  auto resolved = weight_files_of(a.paths, a.revision, a.offline, a.dummy ? nullptr : &s.sources);
  if (s.world) {
    auto all = s.world->all_gather_strings(resolved.ok() ? std::string() : resolved.status().to_string());
    if (!all.ok()) return fail(all.status());
    for (size_t k = 0; k < all->size() && resolved.ok(); ++k)
      if (!(*all)[k].empty())
        return fail(Status::Aborted(fmt::format("rank {} of {} failed: {}", k, all->size(), (*all)[k])));
  }
  if (!resolved.ok()) return fail(resolved.status());
  s.files = std::move(*resolved);
  if (!a.preallocated) return std::nullopt;
  if (a.tp_size > 1 || !a.shard_rules.empty() || a.dummy)
    return usage_error("--into-preallocated loads whole tensors (no --tp-size, --shard-rule or --dummy)");
  auto p = preallocate(s.files);
  if (!p.ok()) return fail(p.status());
  s.pre = std::move(*p);
  s.opt.destination = s.pre->dest.get();
  return std::nullopt;
}

// What the load hands over: every tensor kept until the end (the load's
// result), and with --checksum a line per tensor (printed in checkpoint order).
struct Output {
  const LoadArgs& a;
  std::vector<LoadedTensor> kept;
  std::vector<std::pair<uint64_t, std::string>> rows;

  Status take(LoadedTensor&& t) {
    if (a.checksum) {
      std::string digest;
      if (t.view.device().host_accessible()) {
        digest = sha256_hex(t.view.bytes());
      } else {  // device memory: hash a copy
        auto host = Buffer::allocate(t.view.nbytes());
        if (!host.ok()) return host.status();
        WL_RETURN_IF_ERROR(gpu::copy_to_host(t.view, host->span()));
        digest = sha256_hex(host->span());
      }
      nlohmann::ordered_json j = {
          {"name", t.name}, {"dtype", dtype_name(t.view.dtype())}, {"shape", t.view.shape()}, {"sha256", digest}};
      std::string line = a.format == "jsonl"
                             ? json_line(j)
                             : fmt::format("{:<56} {:<6} {:<20} {}\n", inert(t.name), dtype_name(t.view.dtype()),
                                           shape_to_string(t.view.shape()), j["sha256"].get<std::string>());
      rows.emplace_back(t.ordinal, std::move(line));
    }
    kept.push_back(std::move(t));
    return Status();
  }
  // Checkpoint order whatever the strategy, so outputs compare byte for byte.
  void print() {
    std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.first < y.first; });
    for (auto& [_, line] : rows) std::fwrite(line.data(), 1, line.size(), stdout);
  }
};

// The summary line on stderr: what was loaded, how fast, the strategy that
// ran, where to, memory and bytes read.
void print_summary(const LoadArgs& a, const Setup& s, const LoadStats& r, uint64_t storage_read) {
  double gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0.0;
  std::string strat = a.dummy ? std::string("dummy") : std::string(strategy_name(r.strategy));
  if (r.strategy == Strategy::kStream)
    strat += r.gds               ? " (GDS)"
             : r.direct_io       ? " (O_DIRECT)"
             : r.host_registered ? " (page cache, registered)"
                                 : " (buffered)";
  if (s.device.kind == DeviceKind::kCuda && s.opt.strategy != Strategy::kAuto && s.opt.strategy != r.strategy)
    strat += fmt::format(" (asked: {}; a device load streams)", strategy_name(s.opt.strategy));
  if (s.world)
    strat += fmt::format(" (distributed, rank {} of {}, received {} bytes)", s.world->rank(), s.world->world_size(),
                         r.bytes_exchanged);
  std::string where = s.device.to_string();
  if (s.dest)
    where += fmt::format(", {} memory {:.1f} MiB", s.device.kind == DeviceKind::kCuda ? "device" : "pinned",
                         static_cast<double>(s.dest->allocated_bytes()) / (1 << 20));
  std::fprintf(stderr,
               "loaded %llu tensors, %llu bytes from %zu files in %.3f s (%.2f GB/s), strategy %s, to %s, "
               "peak RSS %.1f MiB, read %llu bytes, skipped %llu expert tensors, storage read %llu bytes\n",
               static_cast<unsigned long long>(r.tensors), static_cast<unsigned long long>(r.bytes), s.files.size(),
               r.seconds, gbps, strat.c_str(), where.c_str(), static_cast<double>(peak_rss_bytes()) / (1 << 20),
               static_cast<unsigned long long>(r.bytes_read), static_cast<unsigned long long>(r.skipped_tensors),
               static_cast<unsigned long long>(storage_read));
  if (s.dest && a.verbose)
    std::fprintf(stderr, "gpu: once per process: %s\n", gpu::process_costs().to_string().c_str());
}

int run_load(const LoadArgs& a) {
  auto net = apply_network_flags(a.net);
  if (!net.ok()) return usage_error(net.status().message());
  Setup s;
  if (auto e = read_flags(a, s.opt)) return *e;
  if (auto e = open_destination(a, s)) return *e;
  if (auto e = resolve_files(a, s)) return *e;
  const bool leader = a.tp_rank == 0 && a.rank == 0 && (!s.world || s.world->rank() == 0);
  // --verbose: the engine's log, which starts with the plan it made (its
  // reasons and the readers' setup), then what the load says as it runs.
  // Lines name files and URLs: inert (text.h).
  if (leader && a.verbose)
    s.opt.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", inert(line).c_str()); };
  std::unique_ptr<ProgressBar> bar;
  if (leader && !a.no_progress) {
    s.opt.progress = [&bar](const LoadProgress& p) {
      if (!bar) bar = std::make_unique<ProgressBar>("Loading checkpoint shards", p.bytes_total, true, stderr, "B");
      bar->update(p.bytes_done);
      return true;
    };
  }
  Output out{a};
  auto sink = [&out](LoadedTensor&& t) { return out.take(std::move(t)); };
  // Storage reads of the load alone: libraries (MPI's plugins, libcurl) faulted
  // in before it count in /proc/self/io too.
  const uint64_t storage_before = storage_read_bytes();
  auto r = a.dummy ? load_dummy(s.files, a.dummy_seed, a.threads, sink) : load_files(s.files, s.opt, sink);
  if (!r.ok()) return fail(r.status());
  if (bar) bar->finish();
  out.print();
  print_summary(a, s, *r, storage_read_bytes() - storage_before);
  return 0;
}

// "auto (default) | lazy | ..." from the engine's vocabulary.
std::string strategy_help() {
  std::string help = "auto (default)";
  for (const std::string& n : strategy_names())
    if (n != "auto") help += " | " + n;
  return help;
}

RunFn setup_load(CLI::App& sub) {
  auto a = std::make_shared<LoadArgs>();
  sub.add_option("paths", a->paths, "weight files or model folders")->required();
  sub.add_option("--strategy", a->strategy, strategy_help());
  sub.add_flag("--checksum", a->checksum, "print the SHA-256 of every tensor's bytes");
  sub.add_option("--format", a->format, "output format of --checksum")->check(CLI::IsMember({"table", "jsonl"}));
  sub.add_flag("--no-progress", a->no_progress, "no progress bar or log lines");
  sub.add_flag("--verbose", a->verbose,
               "log the engine's plan (its reasons and the readers' setup) and prefetch progress (stderr)");
  sub.add_option("--threads", a->threads, "workers for prefetch / threads / stream (default 8)");
  sub.add_option("--block-size", a->block_size, "prefetch block / stream read size, e.g. 16MiB");
  sub.add_option("--tp-rank", a->tp_rank, "tensor-parallel rank");
  sub.add_option("--tp-size", a->tp_size, "tensor-parallel world size");
  sub.add_option("--rank", a->rank, "data-parallel rank (prefetch striping)");
  sub.add_option("--world-size", a->world_size, "data-parallel world size (prefetch striping)");
  sub.add_option("--shard-rule", a->shard_rules, "PATTERN:DIM: tensors matching the glob split along DIM");
  sub.add_option("--experts", a->experts, "local expert ids, e.g. 0-7,12: other experts' weights are never read");
  sub.add_option("--max-memory", a->max_memory, "stream: cap on the loader's working memory, e.g. 512MiB");
  sub.add_option("--direct", a->direct, "stream: O_DIRECT auto | on | off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  sub.add_option("--revision", a->revision, "Hub revision when PATH is a repository id");
  sub.add_flag("--offline", a->offline, "resolve repository ids from the local Hub cache only");
  sub.add_flag("--dummy", a->dummy, "fill every tensor with reproducible random values instead of reading it");
  sub.add_option("--dummy-seed", a->dummy_seed, "seed of --dummy (default 1234, as vLLM)");
  sub.add_option("--device", a->device, "where tensors land: cpu (default) | pinned | cuda | cuda:N");
  sub.add_option("--gds", a->gds, "GPUDirect Storage for --device cuda: auto (default) | on | off");
  sub.add_flag("--distributed", a->distributed,
               "under mpirun -np N: the N ranks read the checkpoint once in total and exchange over MPI "
               "(with --shard-rule each keeps its own shard)");
  sub.add_option("--dist-timeout", a->dist_timeout,
                 "--distributed: seconds to wait for the other ranks before aborting the job (default 600)");
  sub.add_flag("--into-preallocated", a->preallocated,
               "read into one buffer per tensor allocated and touched before the load (as a model's parameters)");
  add_network_flags(sub, a->net);
  return [a] { return run_load(*a); };
}

Register reg("load", "Load every tensor into host, pinned or CUDA memory and report speed and memory", setup_load);

}  // namespace
}  // namespace wl::cli

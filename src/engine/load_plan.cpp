// plan_load() and execute() (weightlift/load_plan.h): a load decided once,
// as a value, then carried out by the runners, which read only the plan.
#include "weightlift/load_plan.h"

#include <chrono>

#include <fmt/format.h>

#include "engine/delivery.h"
#include "engine/load_plan.h"
#include "engine/read_facts.h"
#include "engine/strategies.h"

namespace wl {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Status check_options(const LoadOptions& o) {
  if (o.env == nullptr) return Status::InvalidArgument("LoadOptions.env is null");
  if (o.system == nullptr) return Status::InvalidArgument("LoadOptions.system is null");
  if (o.threads < 0) return Status::InvalidArgument(fmt::format("thread count {} is negative", o.threads));
  if (o.threads > 1024) return Status::InvalidArgument(fmt::format("thread count {} is above 1024", o.threads));
  if (o.block_size > (uint64_t{1} << 30)) return Status::InvalidArgument("block size is above 1 GiB");
  if (o.tp_size < 1 || o.tp_rank < 0 || o.tp_rank >= o.tp_size)
    return Status::InvalidArgument(fmt::format("tensor-parallel rank {} is outside [0, {})", o.tp_rank, o.tp_size));
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    return Status::InvalidArgument(fmt::format("rank {} is outside [0, {})", o.rank, o.world_size));
  return Status();
}

// How the plan reads, in one line.
std::string how(const LoadPlan::Body& b) {
  const ReadPath& p = b.path;
  std::string s(strategy_name(p.strategy));
  if (p.strategy == Strategy::kStream) s += p.gds ? " (GDS)" : p.direct ? " (O_DIRECT)" : " (buffered)";
  if (p.file_views) s += p.populate_views ? ", file views" : ", file views (pages left unread)";
  if (b.ordered) s += ", checkpoint order";
  if (p.strategy == Strategy::kThreads) s += fmt::format(", {} workers", p.workers);
  if (p.strategy == Strategy::kPrefetch)
    s += fmt::format(", prefetching with {} threads of {} KiB blocks", p.prefetch_threads, p.prefetch_block >> 10);
  if (b.exchange)
    s += fmt::format(", exchanged in blocks of {} KiB ({}), {} scatter threads", b.exchange->block >> 10,
                     b.exchange->arena ? "into one arena" : "through exchange buffers", p.scatter_threads);
  return s;
}

// The readers' setup, as the log's last line (the stream's: StreamSetup::describe()).
std::string setup_line(const ReadPath& p) {
  const char* views = p.file_views ? ", file views" : "";
  switch (p.strategy) {
    case Strategy::kStream: return p.stream.describe();
    case Strategy::kThreads: return fmt::format("threads: {} workers loading whole files{}", p.workers, views);
    case Strategy::kPrefetch:
      return fmt::format("prefetch: {} threads of {} KiB blocks into the page cache, then lazy{}", p.prefetch_threads,
                         p.prefetch_block >> 10, views);
    case Strategy::kEager: return fmt::format("eager: one file at a time, each read whole{}", views);
    case Strategy::kAuto:
    case Strategy::kLazy: break;
  }
  return fmt::format("lazy: one file at a time, tensor by tensor{}", views);
}

// A load on one process: the destination told every tensor, then the runner.
Result<LoadStats> run_local(const LoadPlan& plan, const std::function<Status(LoadedTensor&&)>& sink) {
  const LoadPlan::Body& b = plan.body();
  LoadStats stats;
  stats.skipped_tensors = b.plan.skipped;
  stats.strategy = b.path.strategy;
  Destination& dest = engine::destination_of(b);
  {
    std::vector<TensorRequest> requests(b.plan.tensors.size());
    for (const engine::PlannedTensor& t : b.plan.tensors) requests[t.ordinal] = t.request();
    WL_RETURN_IF_ERROR(dest.reserve(requests));
  }
  engine::Delivery d(b.progress, b.ordered, sink, b.plan);
  Status st;
  switch (b.path.strategy) {
    case Strategy::kPrefetch: st = engine::run_prefetch(plan, d, stats); break;
    case Strategy::kAuto:
    case Strategy::kLazy: st = engine::run_lazy(plan, d, stats); break;
    case Strategy::kEager: st = engine::run_eager(plan, d, stats); break;
    case Strategy::kThreads: st = engine::run_threads(plan, d, stats); break;
    case Strategy::kStream: st = engine::run_stream(plan, d, stats); break;
  }
  if (st.ok()) st = d.status();
  if (!st.ok()) return st;
  stats.tensors = d.tensors();
  stats.bytes = d.bytes();
  return stats;
}

}  // namespace

// ---- LoadPlan ------------------------------------------------------------------------------

LoadPlan::LoadPlan() : body_(std::make_unique<Body>()) {}
LoadPlan::~LoadPlan() = default;
LoadPlan::LoadPlan(LoadPlan&&) noexcept = default;
LoadPlan& LoadPlan::operator=(LoadPlan&&) noexcept = default;
LoadPlan::LoadPlan(std::unique_ptr<Body> body) : body_(std::move(body)) {}

size_t LoadPlan::file_count() const { return body_->plan.files.size(); }
size_t LoadPlan::tensor_count() const {
  return body_->exchange ? body_->exchange->totals.tensors_total : body_->plan.tensors.size();
}
uint64_t LoadPlan::bytes() const {
  return body_->exchange ? body_->exchange->totals.bytes_total : body_->plan.bytes_total;
}
uint64_t LoadPlan::skipped_tensors() const { return body_->exchange ? body_->exchange->skipped : body_->plan.skipped; }
const ReadPath& LoadPlan::path() const { return body_->path; }
bool LoadPlan::ordered() const { return body_->ordered; }
const std::vector<std::string>& LoadPlan::log() const { return body_->lines; }

std::string LoadPlan::describe() const {
  std::string out = fmt::format("plan: {} files, {} tensors, {} bytes", file_count(), tensor_count(), bytes());
  if (skipped_tensors() > 0) out += fmt::format(", {} expert tensors left to other ranks", skipped_tensors());
  out += "\nread: " + how(*body_);
  for (const std::string& line : body_->lines) out += "\n" + line;
  return out;
}

// ---- planning and carrying out -----------------------------------------------------------------

Result<LoadPlan> plan_load(const std::vector<std::string>& files, const LoadOptions& o) {
  WL_RETURN_IF_ERROR(check_options(o));
  const auto t0 = Clock::now();
  auto b = std::make_unique<LoadPlan::Body>();
  b->files = files;
  b->env = o.env;
  b->system = o.system;
  b->destination = o.destination;
  b->collective = o.collective;
  b->progress = o.progress;
  b->log = o.log;
  b->rank = o.rank;
  b->world_size = o.world_size;
  if (o.collective != nullptr) {
    WL_RETURN_IF_ERROR(engine::plan_distributed(files, o, *b));
  } else {
    WL_ASSIGN_OR_RETURN(b->plan, engine::make_plan(files, o));
    WL_ASSIGN_OR_RETURN(b->path, engine::decide(files, o, b->plan));
    b->lines = b->path.log;
    b->lines.push_back(setup_line(b->path));
  }
  b->ordered = o.ordered || b->path.ordered;
  if (o.log)
    for (const std::string& line : b->lines) o.log(line);
  b->seconds = seconds_since(t0);
  return LoadPlan(std::move(b));
}

Result<LoadStats> execute(const LoadPlan& plan, const std::function<Status(LoadedTensor&&)>& sink) {
  const LoadPlan::Body& b = plan.body();
  const auto t0 = Clock::now();
  auto r = b.exchange ? engine::run_distributed(plan, sink) : run_local(plan, sink);
  if (r.ok()) r->seconds = b.seconds + seconds_since(t0);
  return r;
}

namespace engine {

Result<LoadPlan> plan_read_ahead(const std::vector<std::string>& files, const LoadOptions& o) {
  WL_RETURN_IF_ERROR(check_options(o));
  auto b = std::make_unique<LoadPlan::Body>();
  b->files = files;
  b->env = o.env;
  b->system = o.system;
  WL_ASSIGN_OR_RETURN(b->plan, make_plan(files, o));
  WL_ASSIGN_OR_RETURN(b->path, decide(files, o, b->plan, /*read_ahead=*/true));
  b->lines = b->path.log;
  return LoadPlan(std::move(b));
}

Destination& destination_of(const LoadPlan::Body& b) {
  return b.destination != nullptr ? *b.destination : default_destination();
}

}  // namespace engine

}  // namespace wl

// A distributed load: W ranks read the checkpoint once in total (the rank
// plan, rank_plan.h) and exchange the shared bytes over the caller's
// Collective. The protocol, the same on every rank:
//   1. hello      (plan_load) every rank plans the load, its read path
//                 included, and all-gathers a small message: its status, a
//                 digest of every file's header, its shard rules, its experts
//                 and its exchange block wish. Any rank's failure, or headers
//                 or rules that disagree, fail every rank here, before any
//                 byte is exchanged.
//   2. own        a background thread reads this rank's own tensors (its
//                 shards, tensors only it keeps) with the stream strategy,
//                 straight into the destination.
//   3. rounds     the shared stream in rounds: this rank's next block is read
//                 (again through run_stream, into the exchange buffer) while the
//                 previous round is all-gathered and scattered into tensors.
//                 Each block carries a trailer flag; a rank that failed sets it
//                 and every rank then all-gathers the error messages and fails.
//   4. goodbye    every rank all-gathers its final status: one rank's failure
//                 (its own reads included) fails all of them.
// A failing collective call (a peer gone, a timeout) ends the load at once and
// calls Collective::abort().
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/runs.h"
#include "engine/load_plan.h"
#include "engine/rank_plan.h"
#include "engine/read_facts.h"
#include "engine/strategies.h"
#include "weightlift/expert_filter.h"

namespace wl::engine {

namespace {

using Sink = std::function<Status(LoadedTensor&&)>;

constexpr uint64_t kTrailer = 64;  // after each block: a failure flag
constexpr uint64_t kAlign = 4096;

std::string status_text(const Status& s) {
  return nlohmann::json{{"code", static_cast<int>(s.code())}, {"message", s.to_string()}}.dump();
}

Status status_from_text(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Internal("unreadable status from a peer");
  return Status(static_cast<Code>(j.value("code", static_cast<int>(Code::kInternal))),
                j.value("message", std::string()));
}

// One rank's failure as every other rank reports it.
Status peer_failure(int rank, int world, const Status& theirs, std::string_view when) {
  return Status::Aborted(fmt::format("rank {} of {} failed {}: {}", rank, world, when, theirs.to_string()));
}

// The first failure in `statuses` (empty strings are OK), as this rank reports it.
Status first_failure(const std::vector<std::string>& statuses, const Status& mine, std::string_view when) {
  if (!mine.ok()) return mine;
  for (size_t k = 0; k < statuses.size(); ++k) {
    if (statuses[k].empty()) continue;
    return peer_failure(static_cast<int>(k), static_cast<int>(statuses.size()), status_from_text(statuses[k]), when);
  }
  return Status();
}

struct Hello {
  Status status;
  std::vector<std::string> digests;
  std::vector<std::string> names;  // base names (messages only)
  std::string rules;
  std::optional<std::vector<int64_t>> experts;
  uint64_t block = 0;
  bool arena = false;  // can receive into one engine-owned buffer
};

std::string encode(const Hello& h) {
  nlohmann::json j;
  j["v"] = 1;
  j["status"] = h.status.ok() ? std::string() : status_text(h.status);
  j["digests"] = h.digests;
  j["names"] = h.names;
  j["rules"] = h.rules;
  j["experts"] = h.experts ? nlohmann::json(*h.experts) : nlohmann::json(nullptr);
  j["block"] = h.block;
  j["arena"] = h.arena;
  return j.dump();
}

Result<Hello> decode(const std::string& text, int rank) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  auto bad = [&] {
    return Status::Aborted(fmt::format("rank {} sent an unreadable hello (another weightlift version?)", rank));
  };
  if (j.is_discarded() || !j.is_object() || j.value("v", 0) != 1) return bad();
  try {
    Hello h;
    std::string st = j.at("status").get<std::string>();
    if (!st.empty()) h.status = status_from_text(st);
    h.digests = j.at("digests").get<std::vector<std::string>>();
    h.names = j.at("names").get<std::vector<std::string>>();
    h.rules = j.at("rules").get<std::string>();
    if (!j.at("experts").is_null()) h.experts = j.at("experts").get<std::vector<int64_t>>();
    h.block = j.at("block").get<uint64_t>();
    h.arena = j.at("arena").get<bool>();
    if (h.names.size() != h.digests.size()) return bad();
    return h;
  } catch (const nlohmann::json::exception&) {
    return bad();
  }
}

std::string rules_text(const std::vector<ShardRule>& rules) {
  std::string out;
  for (const ShardRule& r : rules) out += fmt::format("{}:{};", r.pattern, r.dim);
  return out;
}

// A plain thread whose function's Status is collected by join().
class Task {
 public:
  Task() = default;
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() { (void)join(); }
  template <class F>
  void start(F f) {
    (void)join();
    thread_ = std::thread([this, f = std::move(f)]() mutable { status_ = f(); });
  }
  Status join() {
    if (thread_.joinable()) thread_.join();
    Status s = std::move(status_);
    status_ = Status();
    return s;
  }

 private:
  std::thread thread_;
  Status status_;
};

// ---- planning: the hello, the agreement, the rank plan ------------------------------------

// A collective call failed while planning: the group is unusable.
Status broken(Collective& c, Status s) {
  c.abort(s);
  return s;
}

Result<std::vector<std::string>> gather_strings(Collective& c, const std::string& mine) {
  auto r = c.all_gather_strings(mine);
  if (!r.ok()) return broken(c, r.status());
  if (r->size() != static_cast<size_t>(c.world_size()))
    return broken(c, Status::Internal(fmt::format("all_gather_strings returned {} strings for {} ranks", r->size(),
                                                  c.world_size())));
  return r;
}

// This rank's part: the plan (every tensor, this rank's shards) and its read
// path (choose(), the one decision: the exchange block wish included).
Status plan_mine(const std::vector<std::string>& files, const LoadOptions& o, int world, int me, LoadPlan::Body& b) {
  if (o.tp_size != 1 && (o.tp_size != world || o.tp_rank != me))
    return Status::InvalidArgument(fmt::format(
        "distributed loading shards by rank: tensor-parallel rank {} of {} must be the collective's rank {} of {}",
        o.tp_rank, o.tp_size, me, world));
  LoadOptions po = o;  // every tensor (the experts are filtered by rank later), this rank's shards
  po.local_experts.reset();
  po.collective = nullptr;
  if (!o.shard_rules.empty()) po.tp_rank = me, po.tp_size = world;
  WL_ASSIGN_OR_RETURN(b.plan, make_plan(files, po));
  WL_ASSIGN_OR_RETURN(b.path, decide(files, o, b.plan));
  return Status();
}

// Every rank's hello; the first disagreement or failure as this rank reports it.
Status agree(const std::vector<Hello>& all, int world) {
  for (int k = 0; k < world; ++k)
    if (!all[static_cast<size_t>(k)].status.ok())
      return peer_failure(k, world, all[static_cast<size_t>(k)].status, "before the exchange");
  const Hello& ref = all[0];
  for (int k = 1; k < world; ++k) {
    const Hello& h = all[static_cast<size_t>(k)];
    if (h.digests.size() != ref.digests.size()) {
      // Name a file one side has and the other lacks.
      const bool fewer = h.names.size() < ref.names.size();
      const auto& more = fewer ? ref.names : h.names;
      const auto& less = fewer ? h.names : ref.names;
      std::string lacking;
      for (const std::string& n : more)
        if (std::find(less.begin(), less.end(), n) == less.end()) {
          lacking = fmt::format(" (rank {} lacks '{}')", fewer ? k : 0, n);
          break;
        }
      return Status::Aborted(fmt::format("ranks disagree on the checkpoint: rank {} has {} files, rank 0 has {}{}", k,
                                         h.digests.size(), ref.digests.size(), lacking));
    }
    for (size_t f = 0; f < ref.digests.size(); ++f)
      if (h.digests[f] != ref.digests[f])
        return Status::Aborted(fmt::format(
            "ranks disagree on the checkpoint: file {} of {} ('{}' on rank {}, '{}' on rank 0) has a different header",
            f + 1, ref.digests.size(), h.names[f], k, ref.names[f]));
    if (h.rules != ref.rules)
      return Status::Aborted(
          fmt::format("ranks disagree on the shard rules: rank {} has '{}', rank 0 has '{}'", k, h.rules, ref.rules));
  }
  return Status();
}

// The rank plan (the same on every rank: same headers, same hellos), what
// this rank hands over, and its own tensors as a plan of their own.
Status plan_exchange(const LoadPlan::Body& b, Exchange& x) {
  RankPlanInput in;
  in.world = x.world;
  in.rank = x.me;
  in.block = x.block;
  in.wants.assign(static_cast<size_t>(x.world), {});
  for (const PlanFile& pf : b.plan.files)
    for (size_t ti : pf.tensors) x.order.push_back(ti);
  for (size_t ti : x.order) {
    const PlannedTensor& t = b.plan.tensors[ti];
    in.tensors.push_back({static_cast<uint32_t>(t.file), t.file_offset, t.full_nbytes, t.shard.has_value(), t.nbytes});
    for (int k = 0; k < x.world; ++k)
      in.wants[static_cast<size_t>(k)].push_back(!should_skip_weight(t.name, x.experts[static_cast<size_t>(k)]));
  }
  // Every rank computes the same plan from the same inputs, so a failure here is everyone's.
  WL_ASSIGN_OR_RETURN(x.rp, make_rank_plan(in));
  x.want = in.wants[static_cast<size_t>(x.me)];
  x.totals.files_total = b.plan.files.size();
  for (size_t i = 0; i < x.order.size(); ++i) {
    if (!x.want[i]) {
      x.skipped++;
      continue;
    }
    x.totals.tensors_total++;
    x.totals.bytes_total += b.plan.tensors[x.order[i]].nbytes;
  }
  // This rank's own tensors: streamed into the destination, in half the cap.
  auto own = std::make_unique<LoadPlan::Body>();
  for (const PlanFile& pf : b.plan.files) own->plan.files.push_back({pf.path, pf.version, pf.digest, nullptr, {}});
  for (uint32_t i : x.rp.own) {
    PlannedTensor t = b.plan.tensors[x.order[i]];
    own->plan.files[t.file].tensors.push_back(own->plan.tensors.size());
    own->plan.bytes_total += t.nbytes;
    own->plan.tensors.push_back(std::move(t));
  }
  own->path = b.path;
  own->path.stream = fit_stream(b.path.stream, x.rp.own_bytes[static_cast<size_t>(x.me)]);
  own->env = b.env, own->system = b.system, own->destination = b.destination, own->log = b.log;
  x.own = LoadPlan(std::move(own));
  return Status();
}

}  // namespace

Status plan_distributed(const std::vector<std::string>& files, const LoadOptions& o, LoadPlan::Body& b) {
  Collective& c = *o.collective;
  const int world = c.world_size(), me = c.rank();
  if (world < 1 || me < 0 || me >= world)
    return Status::InvalidArgument(fmt::format("collective rank {} is outside [0, {})", me, world));
  Hello mine;
  Status local = plan_mine(files, o, world, me, b);
  if (local.ok()) {
    for (const PlanFile& pf : b.plan.files) {
      mine.digests.push_back(pf.digest);
      mine.names.push_back(base_name(pf.path));
    }
  }
  mine.status = local;
  mine.rules = rules_text(o.shard_rules);
  if (o.local_experts) mine.experts = std::vector<int64_t>(o.local_experts->begin(), o.local_experts->end());
  mine.block = b.path.exchange_block;
  mine.arena = b.path.exchange_arena;

  WL_ASSIGN_OR_RETURN(auto texts, gather_strings(c, encode(mine)));
  std::vector<Hello> all;
  for (int k = 0; k < world; ++k) {
    if (k == me) {
      all.push_back(mine);
      continue;
    }
    auto h = decode(texts[static_cast<size_t>(k)], k);
    if (!h.ok()) return h.status();  // every rank reads the same texts: all fail alike
    all.push_back(std::move(*h));
  }
  if (!local.ok()) return local;
  WL_RETURN_IF_ERROR(agree(all, world));
  auto x = std::make_unique<Exchange>();
  x->world = world, x->me = me;
  x->block = all[0].block;
  x->arena = true;
  for (const Hello& h : all) {
    x->block = std::min(x->block, h.block);
    x->arena = x->arena && h.arena;
    if (h.experts)
      x->experts.emplace_back(std::set<int64_t>(h.experts->begin(), h.experts->end()));
    else
      x->experts.emplace_back(std::nullopt);
  }
  b.path.exchange_block = x->block;
  b.path.exchange_arena = x->arena;
  WL_RETURN_IF_ERROR(plan_exchange(b, *x));
  const RankPlan& rp = x->rp;
  b.lines.push_back(fmt::format(
      "distributed: rank {} of {} reads {} own + {} shared bytes (of {} shared), {} rounds of {} KiB", me, world,
      rp.own_bytes[static_cast<size_t>(me)], rp.cut[static_cast<size_t>(me) + 1] - rp.cut[static_cast<size_t>(me)],
      rp.shared_bytes, rp.rounds, rp.block >> 10));
  b.lines.insert(b.lines.end(), b.path.log.begin(), b.path.log.end());
  b.lines.push_back(x->own.path().stream.describe());
  b.exchange = std::move(x);
  return Status();
}

namespace {

// ---- the exchange: this rank's own tensors, the rounds, the goodbye ---------------------------

class Runner {
 public:
  Runner(const LoadPlan& plan, const Sink& sink)
      : plan_(plan), b_(plan.body()), x_(*b_.exchange), sink_(sink), c_(*b_.collective), world_(x_.world), me_(x_.me),
        dest_(destination_of(b_)) {}

  Result<LoadStats> run();

 private:
  Status setup_exchange();
  Status exchange();
  Status exchange_in_arena();
  Status flagged(const Status& local);
  Status goodbye(Status mine);
  Status read_slice(uint64_t a, uint64_t b, std::byte* into);
  Status scatter(uint64_t round, const std::byte* x, uint64_t slot);
  // A collective call failed: the group is unusable.
  Status broken(Status s) {
    if (d_) d_->fail(s);
    c_.abort(s);
    return s;
  }
  Result<std::vector<std::string>> gather_strings(const std::string& mine) {
    auto r = c_.all_gather_strings(mine);
    if (!r.ok()) return broken(r.status());
    if (r->size() != static_cast<size_t>(world_))
      return broken(
          Status::Internal(fmt::format("all_gather_strings returned {} strings for {} ranks", r->size(), world_)));
    return r;
  }

  const LoadPlan& plan_;
  const LoadPlan::Body& b_;
  const Exchange& x_;
  const Sink& sink_;
  Collective& c_;
  const int world_, me_;
  Destination& dest_;
  std::unique_ptr<Delivery> d_;
  std::shared_ptr<Buffer> arena_buf_;  // the shared stream, laid out as it is
  std::atomic<uint64_t> bytes_read_{0};

  // The exchange.
  uint64_t slot_ = 0;
  std::vector<Buffer> host_;             // host collectives: 2 exchange buffers; device: 2 read buffers
  std::shared_ptr<std::byte> device_x_;  // device collectives: the exchange buffer
  struct Received {
    Region region;
    uint64_t remaining = 0;
    bool placed = false;
  };
  std::vector<Received> recv_;  // by rank-plan index
};

Result<LoadStats> Runner::run() {
  LoadStats stats;
  stats.strategy = Strategy::kStream;
  stats.skipped_tensors = x_.skipped;
  stats.direct_io = b_.path.direct;
  d_ = std::make_unique<Delivery>(b_.progress, b_.ordered, sink_, x_.totals);
  Status local = setup_exchange();

  // 2. This rank's own tensors, in the background.
  LoadStats own_stats;
  Task own_task;
  if (local.ok() && x_.own.tensor_count() > 0)
    own_task.start([&]() -> Status {
      Status s = run_stream(x_.own, *d_, own_stats);
      if (!s.ok()) d_->fail(s);
      return s;
    });
  else if (!local.ok())
    d_->fail(local);

  // 3. The rounds; a failure already seen is reported in the first round.
  Status ex = exchange();
  Status own_status = own_task.join();
  if (!ex.ok()) return ex;  // every rank has failed alike (or the group broke)
  // 4. Goodbye.
  Status mine = d_->status();
  if (mine.ok()) mine = own_status;
  WL_RETURN_IF_ERROR(goodbye(mine));

  const RankPlan& rp = x_.rp;
  stats.tensors = d_->tensors();
  stats.bytes = d_->bytes();
  stats.bytes_read = own_stats.bytes_read + bytes_read_.load();
  if (x_.arena) {
    const uint64_t my_slice = rp.cut[static_cast<size_t>(me_) + 1] - rp.cut[static_cast<size_t>(me_)];
    stats.bytes_exchanged = rp.shared_bytes - my_slice;
  } else {
    for (uint64_t i = 0; i < rp.rounds; ++i)
      stats.bytes_exchanged += static_cast<uint64_t>(world_ - 1) * (rp.round_block(i) + kTrailer);
  }
  return stats;
}

Status Runner::setup_exchange() {
  slot_ = x_.rp.block + kTrailer;
  recv_.assign(x_.order.size(), {});
  for (uint32_t i : x_.rp.received) recv_[i].remaining = b_.plan.tensors[x_.order[i]].nbytes;
  if (x_.rp.rounds == 0) return Status();
  if (x_.arena) {
    WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(x_.rp.shared_bytes), kAlign));
    arena_buf_ = std::make_shared<Buffer>(std::move(b));
    return Status();
  }
  const uint64_t w = static_cast<uint64_t>(world_);
  const bool device = !c_.device().host_accessible();
  for (int j = 0; j < 2; ++j) {
    WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(device ? slot_ : w * slot_), kAlign));
    host_.push_back(std::move(b));
  }
  if (device) {
    WL_ASSIGN_OR_RETURN(device_x_, c_.allocate(w * slot_));
  }
  return Status();
}

// Shared-stream bytes [a, b) into `into` through the stream strategy: each
// file run is a pseudo-tensor of bytes whose memory is the buffer.
Status Runner::read_slice(uint64_t a, uint64_t b, std::byte* into) {
  std::vector<ReadPiece> pieces = read_pieces(x_.rp, a, b);
  if (pieces.empty()) return Status();
  Plan p;
  std::vector<int64_t> file_map(b_.plan.files.size(), -1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ReadPiece& r = pieces[i];
    if (file_map[r.file] < 0) {
      const PlanFile& pf = b_.plan.files[r.file];
      file_map[r.file] = static_cast<int64_t>(p.files.size());
      p.files.push_back({pf.path, pf.version, pf.digest, nullptr, {}});
    }
    PlannedTensor t;
    t.file = static_cast<size_t>(file_map[r.file]);
    t.name = b_.plan.tensors[x_.order[r.tensor]].name;
    t.shape = t.full_shape = {static_cast<int64_t>(r.len)};
    t.nbytes = t.full_nbytes = r.len;
    t.file_offset = r.file_off;
    t.ordinal = i;
    p.files[t.file].tensors.push_back(p.tensors.size());
    p.bytes_total += r.len;
    p.tensors.push_back(std::move(t));
  }
  auto dest = caller_destination([&](const TensorRequest& req) -> Result<Region> {
    const ReadPiece& r = pieces[req.ordinal];
    return Region{into + r.buf_off, r.len, kCpu, nullptr};
  });
  // The slice as a plan of its own: the plan's reads of the shared stream
  // (into host memory, uncapped), fitted to the slice's bytes; no progress,
  // no log (the tensors count once they are exchanged).
  auto slice = std::make_unique<LoadPlan::Body>();
  slice->plan = std::move(p);
  slice->path = b_.path;
  slice->path.stream = fit_stream(b_.path.exchange_reads, b - a);
  slice->env = b_.env, slice->system = b_.system, slice->destination = dest.get();
  slice->ordered = b_.ordered;
  const LoadPlan plan(std::move(slice));
  const Sink none = [](LoadedTensor&&) { return Status(); };
  Delivery d(nullptr, plan.ordered(), none, plan.body().plan);
  LoadStats st;
  Status s = run_stream(plan, d, st);
  if (s.ok()) s = d.status();
  bytes_read_ += st.bytes_read;
  return s;
}

// The round's bytes into the tensors this rank keeps: regions placed first
// (in stream order), then the copies, in parallel for host exchange memory
// (a rank copies (W-1)/W of everything it receives: one thread's memcpy
// would trail a fast interconnect), then the completed tensors handed over.
Status Runner::scatter(uint64_t round, const std::byte* x, uint64_t slot) {
  struct Copy {
    uint32_t tensor;
    uint64_t dst_off;
    const std::byte* src;
    uint64_t len;
  };
  std::vector<Copy> copies;
  for (int k = 0; k < world_; ++k) {
    auto [a, b] = x_.rp.slice(k, round);
    const std::byte* base = x + static_cast<uint64_t>(k) * slot;
    for (size_t e = first_extent(x_.rp, a); e < x_.rp.shared.size() && x_.rp.shared[e].pos < b; ++e) {
      const SharedExtent& ext = x_.rp.shared[e];
      if (!x_.want[ext.tensor]) continue;
      const uint64_t s = std::max(a, ext.pos), t = std::min(b, ext.pos + ext.len);
      if (s >= t) continue;
      Received& r = recv_[ext.tensor];
      if (!r.placed) {
        const PlannedTensor& pt = b_.plan.tensors[x_.order[ext.tensor]];
        WL_ASSIGN_OR_RETURN(r.region, place(pt, dest_), .file = b_.plan.files[pt.file].path);
        r.placed = true;
      }
      copies.push_back({ext.tensor, ext.dst_off + (s - ext.pos), base + (s - a), t - s});
    }
  }
  auto run = [&](const Copy& cp) -> Status {
    const Region& reg = recv_[cp.tensor].region;
    Status st = c_.device().host_accessible() ? write_region(dest_, reg, cp.dst_off, std::span(cp.src, cp.len))
                                              : c_.copy(reg.data + cp.dst_off, reg.device, cp.src, c_.device(), cp.len);
    if (!st.ok()) {
      const PlannedTensor& pt = b_.plan.tensors[x_.order[cp.tensor]];
      return std::move(st).with_tensor(pt.name).with_file(b_.plan.files[pt.file].path);
    }
    return Status();
  };
  if (!c_.device().host_accessible() || copies.size() <= 1) {  // a device collective is called from one thread
    for (const Copy& cp : copies) WL_RETURN_IF_ERROR(run(cp));
  } else {
    constexpr uint64_t kPiece = uint64_t{4} << 20;
    std::vector<Copy> pieces;
    for (const Copy& cp : copies)
      for (uint64_t o = 0; o < cp.len; o += kPiece)
        pieces.push_back({cp.tensor, cp.dst_off + o, cp.src + o, std::min(kPiece, cp.len - o)});
    WL_RETURN_IF_ERROR(
        run_each_until_error(pieces.size(), b_.path.scatter_threads, [&](size_t, size_t i) { return run(pieces[i]); }));
  }
  for (const Copy& cp : copies) {
    Received& r = recv_[cp.tensor];
    r.remaining -= cp.len;
    if (r.remaining > 0) continue;
    const PlannedTensor& pt = b_.plan.tensors[x_.order[cp.tensor]];
    Status st = d_->deliver(pt, b_.plan.files[pt.file].path, view_of(pt, r.region));
    r.region.owner.reset();  // the delivered view holds it now
    WL_RETURN_IF_ERROR(st);
  }
  return Status();
}

// A rank flagged a failure: every rank gathers the messages and fails alike.
Status Runner::flagged(const Status& local) {
  d_->fail(local.ok() ? Status::Aborted("another rank failed") : local);
  WL_ASSIGN_OR_RETURN(auto statuses, gather_strings(local.ok() ? std::string() : status_text(local)));
  Status s = first_failure(statuses, local, "during the exchange");
  return s.ok() ? Status::Internal("a rank flagged a failure it did not report") : s;
}

// The engine owns the memory: the shared stream lives in one arena, each
// rank reads its slices straight into it, and each round is W in-place
// broadcasts (rank k's slice from rank k) after a small all-gather of
// failure flags. Nothing is copied after it lands; tensors are views of the
// arena (it is freed with the last of them).
Status Runner::exchange_in_arena() {
  std::byte* base = arena_buf_ ? arena_buf_->data() : nullptr;
  Status local = d_->status();
  Task reader;
  // The reader also faults in the pages the round's broadcasts will fill:
  // another process copying into unmapped memory is several times slower.
  auto start_read = [&](uint64_t round) {
    reader.start([this, round, base] {
      auto [a, b] = x_.rp.slice(me_, round);
      Status s = read_slice(a, b, base + a);
      for (int k = 0; k < world_; ++k) {
        auto [ka, kb] = x_.rp.slice(k, round);
        if (k != me_ && kb > ka) arena_buf_->prefault(static_cast<size_t>(ka), static_cast<size_t>(kb - ka));
      }
      return s;
    });
  };
  if (x_.rp.rounds > 0 && local.ok()) start_read(0);
  std::vector<uint64_t> flags(static_cast<size_t>(world_));
  for (uint64_t i = 0; i < x_.rp.rounds; ++i) {
    Status r = reader.join();
    if (local.ok()) local = r;
    if (local.ok()) local = d_->status();
    flags.assign(flags.size(), 0);
    flags[static_cast<size_t>(me_)] = local.ok() ? 0 : 1;
    if (local.ok() && i + 1 < x_.rp.rounds) start_read(i + 1);  // disjoint from this round's slices
    Status g = c_.all_gather(reinterpret_cast<std::byte*>(flags.data()), sizeof(uint64_t));
    if (!g.ok()) {
      d_->fail(g);
      (void)reader.join();
      return broken(g);
    }
    if (std::any_of(flags.begin(), flags.end(), [](uint64_t f) { return f != 0; })) {
      (void)reader.join();
      return flagged(local);
    }
    for (int k = 0; k < world_; ++k) {
      auto [a, b] = x_.rp.slice(k, i);
      if (a == b) continue;  // every rank knows every slice: all skip alike
      g = c_.broadcast(base + a, b - a, k);
      if (!g.ok()) {
        d_->fail(g);
        (void)reader.join();
        return broken(g);
      }
    }
    if (!local.ok()) continue;
    for (int k = 0; k < world_ && local.ok(); ++k) {
      auto [a, b] = x_.rp.slice(k, i);
      for (size_t e = first_extent(x_.rp, a); e < x_.rp.shared.size() && x_.rp.shared[e].pos < b && local.ok(); ++e) {
        const SharedExtent& ext = x_.rp.shared[e];
        if (!x_.want[ext.tensor]) continue;
        Received& rc = recv_[ext.tensor];
        rc.remaining -= std::min(b, ext.pos + ext.len) - std::max(a, ext.pos);
        if (rc.remaining > 0) continue;
        const PlannedTensor& pt = b_.plan.tensors[x_.order[ext.tensor]];
        const std::byte* data = base + ext.pos - ext.dst_off;  // a shared tensor is one extent
        local = d_->deliver(pt, b_.plan.files[pt.file].path,
                            TensorView(pt.dtype, pt.shape, std::span(data, pt.nbytes), arena_buf_));
      }
    }
    if (!local.ok()) d_->fail(local);
  }
  (void)reader.join();
  return Status();
}

Status Runner::exchange() {
  if (x_.arena) return exchange_in_arena();
  const bool device = !c_.device().host_accessible();
  const uint64_t w = static_cast<uint64_t>(world_), me = static_cast<uint64_t>(me_);
  // Round i: W slots of its block + a trailer, in buffer i % 2; where this rank's block is read to.
  auto slot = [&](uint64_t i) { return x_.rp.round_block(i) + kTrailer; };
  auto target = [&](uint64_t i) {
    std::byte* b = host_[static_cast<size_t>(i % 2)].data();
    return device ? b : b + me * slot(i);
  };
  Status local = d_->status();
  Task reader;
  auto start_read = [&](uint64_t round) {
    reader.start([this, round, into = target(round)] {
      auto [a, b] = x_.rp.slice(me_, round);
      return read_slice(a, b, into);
    });
  };
  if (x_.rp.rounds > 0 && local.ok()) start_read(0);
  std::vector<uint64_t> flags(static_cast<size_t>(world_));
  for (uint64_t i = 0; i < x_.rp.rounds; ++i) {
    const uint64_t blk = x_.rp.round_block(i), sl = blk + kTrailer;
    Status r = reader.join();
    if (local.ok()) local = r;
    if (local.ok()) local = d_->status();  // the sink, the progress callback or the own reads failed
    const uint64_t flag = local.ok() ? 0 : 1;
    std::memcpy(target(i) + blk, &flag, sizeof flag);
    std::byte* x = device ? device_x_.get() : host_[static_cast<size_t>(i % 2)].data();
    if (device) {
      Status s = c_.copy(x + me * sl, c_.device(), target(i), kCpu, sl);
      if (!s.ok()) return broken(s);
    }
    if (local.ok() && i + 1 < x_.rp.rounds) start_read(i + 1);
    Status g = c_.all_gather(x, sl);
    if (!g.ok()) {
      d_->fail(g);
      (void)reader.join();
      return broken(g);
    }
    bool any = false;
    for (uint64_t k = 0; k < w; ++k) {
      if (device) {
        Status s =
            c_.copy(reinterpret_cast<std::byte*>(&flags[k]), kCpu, x + k * sl + blk, c_.device(), sizeof(uint64_t));
        if (!s.ok()) return broken(s);
      } else {
        std::memcpy(&flags[k], x + k * sl + blk, sizeof(uint64_t));
      }
      any |= flags[k] != 0;
    }
    if (any) {
      (void)reader.join();
      return flagged(local);
    }
    if (local.ok()) {
      local = scatter(i, x, sl);
      if (!local.ok()) d_->fail(local);
    }
  }
  (void)reader.join();
  return Status();
}

Status Runner::goodbye(Status mine) {
  WL_ASSIGN_OR_RETURN(auto statuses, gather_strings(mine.ok() ? std::string() : status_text(mine)));
  return first_failure(statuses, mine, "while loading");
}

}  // namespace

Result<LoadStats> run_distributed(const LoadPlan& plan, const Sink& sink) {
  Runner r(plan, sink);
  return r.run();
}

}  // namespace wl::engine

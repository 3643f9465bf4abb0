// The distributed runner: W ranks read the checkpoint once in total (the rank
// plan, rank_plan.h) and exchange the shared bytes over the caller's
// Collective. The protocol, the same on every rank:
//   1. hello      every rank plans the load and all-gathers a small message:
//                 its status, a digest of every file's header, its shard rules,
//                 its experts and its block size. Any rank's failure, or headers
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

#include "engine/rank_plan.h"
#include "engine/read_facts.h"
#include "engine/strategies.h"
#include "weightlift/expert_filter.h"

namespace wl::engine {

namespace {

using Sink = std::function<Status(LoadedTensor&&)>;

constexpr uint64_t kTrailer = 64;  // after each block: a failure flag
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kDefaultReadSize = uint64_t{8} << 20;
constexpr int kReadsPerBlock = 4;  // a block is read as this many stream chunks

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

class Runner {
 public:
  Runner(const std::vector<std::string>& files, const LoadOptions& o, const Sink& sink)
      : files_(files), o_(o), sink_(sink), c_(*o.collective), world_(c_.world_size()), me_(c_.rank()),
        dest_(o.destination ? *o.destination : default_destination()) {}

  Result<LoadStats> run();

 private:
  Status hello();
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

  const std::vector<std::string>& files_;
  const LoadOptions& o_;
  const Sink& sink_;
  Collective& c_;
  const int world_, me_;
  Destination& dest_;

  LoadOptions po_;  // the plan's options: every tensor, this rank's shards
  LoadOptions ro_;  // the reads' options
  ReadPath path_;   // the reads' path (the stream strategy; O_DIRECT decided once for both parts)
  Plan plan_;
  std::vector<size_t> order_;                              // rank-plan index -> plan tensor index
  std::vector<std::optional<std::set<int64_t>>> experts_;  // per rank
  uint64_t block_ = 0;
  RankPlan rp_;
  std::unique_ptr<Delivery> d_;
  bool direct_ = false;
  bool arena_ = false;                 // every rank receives straight into its arena
  std::shared_ptr<Buffer> arena_buf_;  // the shared stream, laid out as it is
  int scatter_threads_ = 1;
  std::atomic<uint64_t> bytes_read_{0};

  // The exchange.
  uint64_t slot_ = 0;
  std::vector<Buffer> host_;             // host collectives: 2 exchange buffers; device: 2 read buffers
  std::shared_ptr<std::byte> device_x_;  // device collectives: the exchange buffer
  std::vector<char> want_;               // by rank-plan index: this rank keeps it
  struct Received {
    Region region;
    uint64_t remaining = 0;
    bool placed = false;
  };
  std::vector<Received> recv_;  // by rank-plan index
};

Status Runner::hello() {
  if (world_ < 1 || me_ < 0 || me_ >= world_)
    return Status::InvalidArgument(fmt::format("collective rank {} is outside [0, {})", me_, world_));
  Hello mine;
  po_ = o_;
  po_.local_experts.reset();
  po_.collective = nullptr;
  Status local;
  if (o_.tp_size != 1 && (o_.tp_size != world_ || o_.tp_rank != me_))
    local = Status::InvalidArgument(fmt::format(
        "distributed loading shards by rank: tensor-parallel rank {} of {} must be the collective's rank {} of {}",
        o_.tp_rank, o_.tp_size, me_, world_));
  if (!o_.shard_rules.empty()) po_.tp_rank = me_, po_.tp_size = world_;
  if (local.ok()) {
    auto p = make_plan(files_, po_);
    if (p.ok())
      plan_ = std::move(*p);
    else
      local = p.status();
  }
  if (local.ok()) {
    for (const PlanFile& pf : plan_.files) {
      mine.digests.push_back(pf.digest);
      mine.names.push_back(base_name(pf.path));
    }
  }
  mine.status = local;
  mine.rules = rules_text(o_.shard_rules);
  if (o_.local_experts) mine.experts = std::vector<int64_t>(o_.local_experts->begin(), o_.local_experts->end());
  uint64_t read = o_.block_size > 0 ? o_.block_size : kDefaultReadSize;
  mine.block = read * kReadsPerBlock;
  if (o_.max_memory > 0)  // two exchange buffers of W blocks in half the cap
    mine.block = std::min(mine.block, std::max<uint64_t>(o_.max_memory / 4 / static_cast<uint64_t>(world_), kAlign));
  mine.block = std::max<uint64_t>(mine.block & ~(kAlign - 1), kAlign);
  mine.arena = o_.destination == nullptr && c_.device().host_accessible();

  WL_ASSIGN_OR_RETURN(auto texts, gather_strings(encode(mine)));
  std::vector<Hello> all;
  for (int k = 0; k < world_; ++k) {
    if (k == me_) {
      all.push_back(mine);
      continue;
    }
    auto h = decode(texts[static_cast<size_t>(k)], k);
    if (!h.ok()) return h.status();  // every rank reads the same texts: all fail alike
    all.push_back(std::move(*h));
  }
  if (!local.ok()) return local;
  for (int k = 0; k < world_; ++k)
    if (!all[static_cast<size_t>(k)].status.ok())
      return peer_failure(k, world_, all[static_cast<size_t>(k)].status, "before the exchange");
  const Hello& ref = all[0];
  for (int k = 1; k < world_; ++k) {
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
  block_ = ref.block;
  arena_ = true;
  experts_.clear();
  for (const Hello& h : all) {
    block_ = std::min(block_, h.block);
    arena_ = arena_ && h.arena;
    if (h.experts)
      experts_.emplace_back(std::set<int64_t>(h.experts->begin(), h.experts->end()));
    else
      experts_.emplace_back(std::nullopt);
  }
  return Status();
}

Result<LoadStats> Runner::run() {
  auto t0 = std::chrono::steady_clock::now();
  WL_RETURN_IF_ERROR(hello());

  // The rank plan: the same on every rank (same headers, same hellos).
  RankPlanInput in;
  in.world = world_;
  in.rank = me_;
  in.block = block_;
  in.wants.assign(static_cast<size_t>(world_), {});
  for (const PlanFile& pf : plan_.files)
    for (size_t ti : pf.tensors) order_.push_back(ti);
  for (size_t ti : order_) {
    const PlannedTensor& t = plan_.tensors[ti];
    in.tensors.push_back({static_cast<uint32_t>(t.file), t.file_offset, t.full_nbytes, t.shard.has_value(), t.nbytes});
    for (int k = 0; k < world_; ++k)
      in.wants[static_cast<size_t>(k)].push_back(!should_skip_weight(t.name, experts_[static_cast<size_t>(k)]));
  }
  // Every rank computes the same plan from the same inputs, so a failure here is everyone's.
  WL_ASSIGN_OR_RETURN(rp_, make_rank_plan(in));
  want_ = in.wants[static_cast<size_t>(me_)];

  LoadStats stats;
  stats.strategy = Strategy::kStream;
  LoadProgress totals;
  totals.files_total = plan_.files.size();
  for (size_t i = 0; i < order_.size(); ++i) {
    if (!want_[i]) {
      stats.skipped_tensors++;
      continue;
    }
    totals.tensors_total++;
    totals.bytes_total += plan_.tensors[order_[i]].nbytes;
  }
  d_ = std::make_unique<Delivery>(o_, sink_, totals);
  if (o_.log)
    o_.log(fmt::format("distributed: rank {} of {} reads {} own + {} shared bytes (of {} shared), {} rounds of {} KiB",
                       me_, world_, rp_.own_bytes[static_cast<size_t>(me_)],
                       rp_.cut[static_cast<size_t>(me_) + 1] - rp_.cut[static_cast<size_t>(me_)], rp_.shared_bytes,
                       rp_.rounds, rp_.block >> 10));

  // Reads: the stream strategy, its path chosen once for both parts.
  ro_ = o_;
  ro_.collective = nullptr;
  Status local;
  PlanFacts facts(plan_, files_, o_, &dest_);
  auto path = choose(read_request(files_, o_), facts);
  if (path.ok()) {
    path_ = std::move(*path);
    direct_ = path_.direct;
    if (o_.log)
      for (const auto& line : path_.log) o_.log(line);
  } else {
    local = path.status();
  }
  if (local.ok()) local = setup_exchange();
  scatter_threads_ =
      o_.threads > 0 ? o_.threads : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
  stats.direct_io = direct_;

  // 2. This rank's own tensors, in the background.
  Plan own;
  for (const PlanFile& pf : plan_.files) own.files.push_back({pf.path, pf.version, pf.digest, nullptr, {}});
  for (uint32_t i : rp_.own) {
    PlannedTensor t = plan_.tensors[order_[i]];
    own.files[t.file].tensors.push_back(own.tensors.size());
    own.bytes_total += t.nbytes;
    own.tensors.push_back(std::move(t));
  }
  ReadPath own_path = path_;
  if (o_.max_memory > 0) own_path.max_memory = std::max<uint64_t>(o_.max_memory / 2, 1);
  LoadStats own_stats;
  Task own_task;
  if (local.ok() && !own.tensors.empty())
    own_task.start([&]() -> Status {
      Status s = run_stream(own, ro_, own_path, dest_, *d_, own_stats);
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

  stats.tensors = d_->tensors();
  stats.bytes = d_->bytes();
  stats.bytes_read = own_stats.bytes_read + bytes_read_.load();
  if (arena_) {
    const uint64_t my_slice = rp_.cut[static_cast<size_t>(me_) + 1] - rp_.cut[static_cast<size_t>(me_)];
    stats.bytes_exchanged = rp_.shared_bytes - my_slice;
  } else {
    for (uint64_t i = 0; i < rp_.rounds; ++i)
      stats.bytes_exchanged += static_cast<uint64_t>(world_ - 1) * (rp_.round_block(i) + kTrailer);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

Status Runner::setup_exchange() {
  slot_ = rp_.block + kTrailer;
  recv_.assign(order_.size(), {});
  for (uint32_t i : rp_.received) recv_[i].remaining = plan_.tensors[order_[i]].nbytes;
  if (rp_.rounds == 0) return Status();
  if (arena_) {
    WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(rp_.shared_bytes), kAlign));
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
  std::vector<ReadPiece> pieces = read_pieces(rp_, a, b);
  if (pieces.empty()) return Status();
  Plan p;
  std::vector<int64_t> file_map(plan_.files.size(), -1);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ReadPiece& r = pieces[i];
    if (file_map[r.file] < 0) {
      const PlanFile& pf = plan_.files[r.file];
      file_map[r.file] = static_cast<int64_t>(p.files.size());
      p.files.push_back({pf.path, pf.version, pf.digest, nullptr, {}});
    }
    PlannedTensor t;
    t.file = static_cast<size_t>(file_map[r.file]);
    t.name = plan_.tensors[order_[r.tensor]].name;
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
  const Sink none = [](LoadedTensor&&) { return Status(); };
  LoadOptions ro = ro_;
  ro.progress = nullptr;
  ro.log = nullptr;
  ro.max_memory = 0;
  ro.destination = dest.get();
  ReadPath path = path_;
  path.max_memory = 0;
  Delivery d(ro, none, p);
  LoadStats st;
  Status s = run_stream(p, ro, path, *dest, d, st);
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
    auto [a, b] = rp_.slice(k, round);
    const std::byte* base = x + static_cast<uint64_t>(k) * slot;
    for (size_t e = first_extent(rp_, a); e < rp_.shared.size() && rp_.shared[e].pos < b; ++e) {
      const SharedExtent& ext = rp_.shared[e];
      if (!want_[ext.tensor]) continue;
      const uint64_t s = std::max(a, ext.pos), t = std::min(b, ext.pos + ext.len);
      if (s >= t) continue;
      Received& r = recv_[ext.tensor];
      if (!r.placed) {
        const PlannedTensor& pt = plan_.tensors[order_[ext.tensor]];
        WL_ASSIGN_OR_RETURN(r.region, place(pt, dest_), .file = plan_.files[pt.file].path);
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
      const PlannedTensor& pt = plan_.tensors[order_[cp.tensor]];
      return std::move(st).with_tensor(pt.name).with_file(plan_.files[pt.file].path);
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
    const size_t n = std::min<size_t>(pieces.size(), static_cast<size_t>(scatter_threads_));
    std::atomic<size_t> next{0};
    std::mutex mu;
    Status first;
    auto worker = [&] {
      for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
        Status st = run(pieces[i]);
        if (!st.ok()) {
          std::lock_guard lk(mu);
          if (first.ok()) first = st;
          return;
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t i = 1; i < n; ++i) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    WL_RETURN_IF_ERROR(first);
  }
  for (const Copy& cp : copies) {
    Received& r = recv_[cp.tensor];
    r.remaining -= cp.len;
    if (r.remaining > 0) continue;
    const PlannedTensor& pt = plan_.tensors[order_[cp.tensor]];
    Status st = d_->deliver(pt, plan_.files[pt.file].path, view_of(pt, r.region));
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
      auto [a, b] = rp_.slice(me_, round);
      Status s = read_slice(a, b, base + a);
      for (int k = 0; k < world_; ++k) {
        auto [ka, kb] = rp_.slice(k, round);
        if (k != me_ && kb > ka) arena_buf_->prefault(static_cast<size_t>(ka), static_cast<size_t>(kb - ka));
      }
      return s;
    });
  };
  if (rp_.rounds > 0 && local.ok()) start_read(0);
  std::vector<uint64_t> flags(static_cast<size_t>(world_));
  for (uint64_t i = 0; i < rp_.rounds; ++i) {
    Status r = reader.join();
    if (local.ok()) local = r;
    if (local.ok()) local = d_->status();
    flags.assign(flags.size(), 0);
    flags[static_cast<size_t>(me_)] = local.ok() ? 0 : 1;
    if (local.ok() && i + 1 < rp_.rounds) start_read(i + 1);  // disjoint from this round's slices
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
      auto [a, b] = rp_.slice(k, i);
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
      auto [a, b] = rp_.slice(k, i);
      for (size_t e = first_extent(rp_, a); e < rp_.shared.size() && rp_.shared[e].pos < b && local.ok(); ++e) {
        const SharedExtent& ext = rp_.shared[e];
        if (!want_[ext.tensor]) continue;
        Received& rc = recv_[ext.tensor];
        rc.remaining -= std::min(b, ext.pos + ext.len) - std::max(a, ext.pos);
        if (rc.remaining > 0) continue;
        const PlannedTensor& pt = plan_.tensors[order_[ext.tensor]];
        const std::byte* data = base + ext.pos - ext.dst_off;  // a shared tensor is one extent
        local = d_->deliver(pt, plan_.files[pt.file].path,
                            TensorView(pt.dtype, pt.shape, std::span(data, pt.nbytes), arena_buf_));
      }
    }
    if (!local.ok()) d_->fail(local);
  }
  (void)reader.join();
  return Status();
}

Status Runner::exchange() {
  if (arena_) return exchange_in_arena();
  const bool device = !c_.device().host_accessible();
  const uint64_t w = static_cast<uint64_t>(world_), me = static_cast<uint64_t>(me_);
  // Round i: W slots of its block + a trailer, in buffer i % 2; where this rank's block is read to.
  auto slot = [&](uint64_t i) { return rp_.round_block(i) + kTrailer; };
  auto target = [&](uint64_t i) {
    std::byte* b = host_[static_cast<size_t>(i % 2)].data();
    return device ? b : b + me * slot(i);
  };
  Status local = d_->status();
  Task reader;
  auto start_read = [&](uint64_t round) {
    reader.start([this, round, into = target(round)] {
      auto [a, b] = rp_.slice(me_, round);
      return read_slice(a, b, into);
    });
  };
  if (rp_.rounds > 0 && local.ok()) start_read(0);
  std::vector<uint64_t> flags(static_cast<size_t>(world_));
  for (uint64_t i = 0; i < rp_.rounds; ++i) {
    const uint64_t blk = rp_.round_block(i), sl = blk + kTrailer;
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
    if (local.ok() && i + 1 < rp_.rounds) start_read(i + 1);
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

Result<LoadStats> run_distributed(const std::vector<std::string>& files, const LoadOptions& o, const Sink& sink) {
  Runner r(files, o, sink);
  return r.run();
}

}  // namespace wl::engine

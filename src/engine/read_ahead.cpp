// The read-ahead job (read_ahead.h): plan the load's tensors as load_files()
// would, lay their byte ranges end to end in the load's stream order, keep
// this rank's slice, cut it into blocks and read the blocks on N threads:
// local files into the page cache, remote ones into staging buffers served
// by StagedEnv.
#include "weightlift/read_ahead.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <sys/mman.h>
#include <unistd.h>

#include <fmt/format.h>

#include "core/runs.h"
#include "engine/load_plan.h"
#include "weightlift/load_options.h"
#include "weightlift/tensor.h"

namespace wl {

namespace {

// Ranges closer than this are read as one (alignment padding between
// tensors); a skipped tensor (another rank's expert) is never read.
constexpr uint64_t kMergeGap = 4096;

// Local: blocks (or populate_read's chunks) one thread reads in a row (core/runs.h).
constexpr size_t kRunBlocks = 4;

using Clock = std::chrono::steady_clock;

enum class BlockState : uint8_t { kPending, kInFlight, kStaged, kSkipped };

struct Block {
  size_t file = 0;
  uint64_t offset = 0, len = 0;
  BlockState state = BlockState::kPending;
  bool help = false;      // local: another rank's block, read only where the page cache lacks it
  Buffer data;            // remote: the staged bytes until consumed
  uint64_t consumed = 0;  // remote: bytes the load has taken
};

struct Range {
  uint64_t offset, len;
};

}  // namespace

struct ReadAhead::State {
  std::vector<std::string> files;
  ReadAheadOptions o;
  Clock::time_point t0 = Clock::now();
  std::atomic<double> seconds{-1};
  std::atomic<bool> stop{false};
  std::thread job;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<Block> blocks;  // stream order
  // Blocks [first, second) read in order by one thread, the runs in job
  // order (each pass's own slice, then its helps, cut every kRunBlocks
  // blocks; remote: one block each).
  std::vector<std::pair<size_t, size_t>> runs;
  std::vector<std::vector<size_t>> file_blocks;  // per file: block indices by offset
  std::vector<std::string> versions;             // per file: the version planned
  std::vector<int8_t> cached_;                   // local, per file: -1 not opened yet, 1 mostly cached at first open
  uint64_t staged_bytes = 0, staged_cap = 0;
  int threads = 1;  // the plan's
  ReadAheadProgress p;
  Status status;
  std::unique_ptr<Env> env;

  void fail(Status s) {
    std::lock_guard lk(mu);
    if (status.ok()) status = std::move(s);
  }
  Status plan();
  void read_blocks();
  void read_local(size_t bi, std::vector<std::shared_ptr<RandomAccessFile>>& open);
  void read_remote(size_t bi, std::vector<std::shared_ptr<RandomAccessFile>>& open);
  Result<std::shared_ptr<RandomAccessFile>> open_file(size_t fi, std::vector<std::shared_ptr<RandomAccessFile>>& open,
                                                      FileMode mode);
  // Remote: bytes [off, off+dst.size()) of file fi from staging where staged
  // (waiting for blocks in flight); the gaps are left to `fill` (read from
  // the source). Returns the status of the first failed fill.
  Status serve(size_t fi, uint64_t off, std::span<std::byte> dst,
               const std::function<Status(uint64_t, std::span<std::byte>)>& fill);
  // Remote: whether any block overlapping [off, off+n) is staged or in
  // flight; when none is, the pending ones are claimed (the load reads them
  // from the source, the job no longer will).
  bool any_staged(size_t fi, uint64_t off, uint64_t n);
  // Remote, `mu` held: the load claimed a block the job had not reached:
  // the job takes no further block (those in flight finish and are
  // served), the load's own connections read the rest: the source never
  // sees both the job's and the load's connections at once.
  void overtaken();
  // The file's index when a load opening `path` at `version` may be served
  // staged bytes (remote, planned, same version); SIZE_MAX otherwise.
  size_t file_index(const std::string& path, const std::string& version);
};

namespace {

// The byte ranges of one planned file's tensors, per pass (the first pass:
// tensors `first` names, or all when it is empty), by offset, neighbours of
// the same pass merged (never across a tensor of the other pass: the passes'
// ranges do not overlap). A tensor without contiguous storage (a PyTorch
// file's strided view) takes the whole file, in the first pass.
Result<std::array<std::vector<Range>, 2>> ranges_of(const engine::Plan& plan, const engine::PlanFile& pf, Env* env,
                                                    const std::function<bool(std::string_view)>& first) {
  struct Tagged {
    Range r;
    int pass;
  };
  std::vector<Tagged> rs;
  for (size_t ti : pf.tensors) {
    const auto& t = plan.tensors[ti];
    if (!t.file_offset) {
      WL_ASSIGN_OR_RETURN(uint64_t size, env->file_size(pf.path));
      return std::array<std::vector<Range>, 2>{std::vector<Range>{{0, size}}, {}};
    }
    if (t.full_nbytes > 0) rs.push_back({{*t.file_offset, t.full_nbytes}, first && !first(t.name) ? 1 : 0});
  }
  std::sort(rs.begin(), rs.end(), [](const Tagged& x, const Tagged& y) { return x.r.offset < y.r.offset; });
  std::array<std::vector<Range>, 2> out;
  int last_pass = -1;
  for (const Tagged& t : rs) {
    std::vector<Range>& v = out[t.pass];
    if (last_pass == t.pass && t.r.offset <= v.back().offset + v.back().len + kMergeGap) {
      v.back().len = std::max(v.back().offset + v.back().len, t.r.offset + t.r.len) - v.back().offset;
    } else {
      v.push_back(t.r);
    }
    last_pass = t.pass;
  }
  return out;
}

// [pass][rank]: each rank's slice of each pass as blocks of at most `block`
// bytes. A pass's ranges in file order are laid end to end and cut into
// `world` near-equal contiguous slices (blocks of other ranks marked help).
using Slices = std::vector<std::vector<std::vector<Block>>>;
Result<Slices> slice_passes(const engine::Plan& plan, Env* env, const std::function<bool(std::string_view)>& first,
                            uint64_t W, uint64_t R, uint64_t block) {
  const int passes = first ? 2 : 1;
  std::vector<std::vector<std::pair<size_t, Range>>> streams(passes);
  std::vector<uint64_t> totals(passes, 0);
  for (size_t fi = 0; fi < plan.files.size(); ++fi) {
    WL_ASSIGN_OR_RETURN(auto rs, ranges_of(plan, plan.files[fi], env, first));
    for (int pass = 0; pass < passes; ++pass)
      for (const Range& r : rs[pass]) streams[pass].push_back({fi, r}), totals[pass] += r.len;
  }
  Slices slices(passes);
  for (int pass = 0; pass < passes; ++pass) {
    slices[pass].resize(W);
    const auto& stream = streams[pass];
    const uint64_t total = totals[pass];
    for (uint64_t k = 0; k < W; ++k) {
      const uint64_t lo_pos = total / W * k + std::min(k, total % W);
      const uint64_t hi_pos = lo_pos + total / W + (k < total % W ? 1 : 0);
      uint64_t pos = 0;
      for (const auto& [fi, r] : stream) {
        const uint64_t a = std::max(pos, lo_pos), b = std::min(pos + r.len, hi_pos);
        for (uint64_t x = a; x < b; x += block) {
          Block bl;
          bl.file = fi;
          bl.offset = r.offset + (x - pos);
          bl.len = std::min(block, b - x);
          bl.help = k != R;
          slices[pass][k].push_back(std::move(bl));
        }
        pos += r.len;
      }
    }
  }
  return slices;
}

// A file whose staged blocks a load reads from memory.
class StagedFile final : public RandomAccessFile {
 public:
  StagedFile(std::shared_ptr<RandomAccessFile> base, ReadAhead::State* s, size_t fi)
      : base_(std::move(base)), s_(s), fi_(fi) {}
  const std::string& path() const override { return base_->path(); }
  uint64_t size() const override { return base_->size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    return s_->serve(fi_, offset, dst, [this](uint64_t off, std::span<std::byte> d) { return base_->read_at(off, d); });
  }
  Status read_scatter_at(uint64_t offset, std::span<const std::span<std::byte>> parts) const override {
    // Nothing of it staged: one request to the source, as without staging;
    // otherwise part by part, staged bytes from memory.
    uint64_t total = 0;
    for (auto& p : parts) total += p.size();
    if (!s_->any_staged(fi_, offset, total)) return base_->read_scatter_at(offset, parts);
    for (auto& p : parts) {
      WL_RETURN_IF_ERROR(read_at(offset, p));
      offset += p.size();
    }
    return Status();
  }
  Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override { return base_->view(offset, n); }
  size_t alignment() const override { return base_->alignment(); }
  void advise(uint64_t offset, uint64_t n, Advice advice) const override { base_->advise(offset, n, advice); }
  std::string version() const override { return base_->version(); }
  double cached_fraction() const override { return base_->cached_fraction(); }
  double cached_fraction_in(uint64_t offset, uint64_t n) const override { return base_->cached_fraction_in(offset, n); }
  bool is_remote() const override { return base_->is_remote(); }

 private:
  std::shared_ptr<RandomAccessFile> base_;
  ReadAhead::State* s_;
  size_t fi_;
};

class StagedEnv final : public EnvWrapper {
 public:
  StagedEnv(Env* target, ReadAhead::State* s) : EnvWrapper(target), s_(s) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    WL_ASSIGN_OR_RETURN(auto f, target()->open(path, o));
    size_t fi = s_->file_index(path, f->version());
    if (fi == SIZE_MAX) return f;
    return std::shared_ptr<RandomAccessFile>(std::make_shared<StagedFile>(std::move(f), s_, fi));
  }

 private:
  ReadAhead::State* s_;
};

}  // namespace

// ---- planning ----------------------------------------------------------------------------------

// The load's own plan (engine::plan_read_ahead: plan now, execute later):
// the tensors it will read, in its stream order, and the read-ahead's sizes.
Status ReadAhead::State::plan() {
  LoadOptions lo;
  lo.env = o.env;
  lo.system = o.system;
  lo.local_experts = o.local_experts;
  lo.select = o.select;
  lo.threads = o.threads;
  lo.block_size = o.block_size;
  lo.max_memory = o.max_memory;
  lo.rank = o.rank, lo.world_size = o.world_size;
  WL_ASSIGN_OR_RETURN(LoadPlan load, engine::plan_read_ahead(files, lo));
  const engine::Plan& plan = load.body().plan;
  const ReadPath::ReadAheadSetup& sizes = load.path().read_ahead;
  const uint64_t block = sizes.block;
  const bool remote = sizes.remote;
  const uint64_t cap = sizes.max_memory;
  const auto W = static_cast<uint64_t>(o.world_size), R = static_cast<uint64_t>(o.rank);
  WL_ASSIGN_OR_RETURN(Slices slices, slice_passes(plan, o.env, o.first, W, R, block));
  // This rank's blocks, pass by pass, as far as the bound admits them (the
  // rest is the load's); local and nothing left out: after each pass's own
  // slice, the other ranks' slices of that pass, the next rank's first, each
  // from its end (its owner reads it from the front: they meet).
  std::vector<Block> bs;
  std::vector<size_t> group_ends;  // bs cut where a pass's own slice or one of its helps ends
  uint64_t planned = 0, capped = 0;
  for (auto& pass : slices) {
    for (Block& bl : pass[R]) {
      planned += bl.len;
      if (!remote && planned > cap) {  // local: what would overflow the page-cache bound is left to the load
        capped += bl.len;
        continue;
      }
      bs.push_back(std::move(bl));
    }
    group_ends.push_back(bs.size());
  }
  if (!remote && capped == 0 && W > 1) {
    std::vector<Block> ordered;
    group_ends.clear();
    size_t own = 0;
    for (auto& pass : slices) {
      for (size_t i = 0; i < pass[R].size(); ++i) ordered.push_back(std::move(bs[own++]));
      group_ends.push_back(ordered.size());
      for (uint64_t d = 1; d < W; ++d) {
        for (auto it = pass[(R + d) % W].rbegin(); it != pass[(R + d) % W].rend(); ++it)
          ordered.push_back(std::move(*it));
        group_ends.push_back(ordered.size());
      }
    }
    bs = std::move(ordered);
  }
  // Local: each group cut into runs of kRunBlocks blocks, each read in
  // order by one thread (core/runs.h says why). Remote: one block at a
  // time in job order (the staging bound admits them so).
  auto rs = cut_runs(group_ends, remote ? 1 : kRunBlocks);
  std::vector<std::vector<size_t>> per_file(plan.files.size());
  for (size_t bi = 0; bi < bs.size(); ++bi) per_file[bs[bi].file].push_back(bi);
  std::lock_guard lk(mu);
  blocks = std::move(bs);
  runs = std::move(rs);
  file_blocks = std::move(per_file);
  for (auto& idx : file_blocks)
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return blocks[x].offset < blocks[y].offset; });
  versions.resize(plan.files.size());
  cached_.assign(plan.files.size(), -1);
  for (size_t fi = 0; fi < plan.files.size(); ++fi) versions[fi] = plan.files[fi].version;
  staged_cap = std::max(cap, block);
  threads = sizes.threads;
  p.bytes_planned = planned;
  p.bytes_capped = capped;
  p.remote = remote;
  p.planned = true;
  cv.notify_all();
  return Status();
}

// ---- reading -----------------------------------------------------------------------------------

Result<std::shared_ptr<RandomAccessFile>> ReadAhead::State::open_file(
    size_t fi, std::vector<std::shared_ptr<RandomAccessFile>>& open, FileMode mode) {
  if (open.size() <= fi) open.resize(fi + 1);
  if (open[fi]) return open[fi];
  WL_ASSIGN_OR_RETURN(auto f, o.env->open(files[fi], {.mode = mode, .expect_version = versions[fi]}));
  open[fi] = f;
  return f;
}

void ReadAhead::State::read_local(size_t bi, std::vector<std::shared_ptr<RandomAccessFile>>& open) {
  size_t fi;
  uint64_t off, len;
  {
    std::lock_guard lk(mu);
    fi = blocks[bi].file, off = blocks[bi].offset, len = blocks[bi].len;
  }
  auto f = open_file(fi, open, FileMode::kMmap);
  if (!f.ok()) return fail(f.status());
  bool cached;
  {
    // Decided once per file, before the job's own reads change the answer.
    std::lock_guard lk(mu);
    if (cached_[fi] < 0) cached_[fi] = (*f)->mostly_cached() ? 1 : 0;
    cached = cached_[fi] == 1;
  }
  const bool help = blocks[bi].help;  // set before the threads start
  // Another rank's block that rank (or the load) has read already: nothing to do.
  if (help && !cached && (*f)->cached_fraction_in(off, len) >= 1.0) cached = true;
  if (!cached) {
    // Pages faulted in (read from disk into the page cache) and unmapped
    // again: the page cache keeps them, this process holds nothing.
    (*f)->advise(off, len, Advice::kPopulate);
    (*f)->advise(off, len, Advice::kRelease);
  }
  std::lock_guard lk(mu);
  blocks[bi].state = BlockState::kStaged;
  if (help) {
    if (!cached) p.bytes_helped += len;
  } else {
    (cached ? p.bytes_cached : p.bytes_read) += len;
  }
}

void ReadAhead::State::read_remote(size_t bi, std::vector<std::shared_ptr<RandomAccessFile>>& open) {
  size_t fi;
  uint64_t off, len;
  {
    std::unique_lock lk(mu);
    // The bound: wait until the load has consumed enough of what is staged.
    cv.wait(lk, [&] {
      return stop.load() || blocks[bi].state != BlockState::kPending || staged_bytes + blocks[bi].len <= staged_cap;
    });
    if (blocks[bi].state != BlockState::kPending || stop.load()) {
      if (blocks[bi].state == BlockState::kPending) blocks[bi].state = BlockState::kSkipped;
      cv.notify_all();
      return;
    }
    blocks[bi].state = BlockState::kInFlight;
    staged_bytes += blocks[bi].len;
    fi = blocks[bi].file, off = blocks[bi].offset, len = blocks[bi].len;
  }
  Status st;
  Buffer buf;
  auto f = open_file(fi, open, FileMode::kPread);
  if (!f.ok()) {
    st = f.status();
  } else if (auto b = Buffer::allocate(static_cast<size_t>(len), 4096); !b.ok()) {
    st = b.status();
  } else {
    buf = std::move(*b);
    st = (*f)->read_at(off, buf.span());
  }
  std::lock_guard lk(mu);
  Block& bl = blocks[bi];
  if (st.ok()) {
    bl.data = std::move(buf);
    bl.state = BlockState::kStaged;
    p.bytes_read += len;
  } else {
    bl.state = BlockState::kSkipped;  // the load reads it from the source
    staged_bytes -= len;
    if (status.ok()) status = st;
  }
  cv.notify_all();
}

void ReadAhead::State::read_blocks() {
  const bool remote = p.remote;
  std::vector<std::vector<std::shared_ptr<RandomAccessFile>>> open(static_cast<size_t>(std::max(threads, 1)));
  run_in_order(runs, threads, [&](size_t w, size_t bi) {
    if (stop.load()) return false;
    remote ? read_remote(bi, open[w]) : read_local(bi, open[w]);
    return true;
  });
  std::lock_guard lk(mu);
  for (auto& b : blocks)
    if (b.state == BlockState::kPending) b.state = BlockState::kSkipped;
  cv.notify_all();
}

// ---- serving staged bytes ------------------------------------------------------------------------

Status ReadAhead::State::serve(size_t fi, uint64_t off, std::span<std::byte> dst,
                               const std::function<Status(uint64_t, std::span<std::byte>)>& fill) {
  uint64_t pos = off;
  const uint64_t end = off + dst.size();
  while (pos < end) {
    std::unique_lock lk(mu);
    const auto& idx = file_blocks[fi];
    // The block holding pos, if any (blocks of a file do not overlap).
    auto it =
        std::upper_bound(idx.begin(), idx.end(), pos, [&](uint64_t x, size_t bi) { return x < blocks[bi].offset; });
    Block* bl = nullptr;
    if (it != idx.begin() && pos < blocks[*(it - 1)].offset + blocks[*(it - 1)].len) bl = &blocks[*(it - 1)];
    if (bl) cv.wait(lk, [&] { return bl->state != BlockState::kInFlight; });
    if (bl && bl->state == BlockState::kStaged && bl->data.size() > 0) {
      const uint64_t n = std::min(end, bl->offset + bl->len) - pos;
      std::memcpy(dst.data() + (pos - off), bl->data.data() + (pos - bl->offset), n);
      bl->consumed += n;
      p.bytes_consumed += n;
      if (bl->consumed >= bl->len) {  // every byte taken: the memory goes back
        staged_bytes -= bl->len;
        bl->data = Buffer();
        cv.notify_all();
      }
      pos += n;
      continue;
    }
    // A gap up to the next staged block (or the end): from the source. A
    // block the job has not reached is the load's now (never read twice).
    if (bl && bl->state == BlockState::kPending) {
      bl->state = BlockState::kSkipped;
      overtaken();
    }
    uint64_t gap_end = end;
    if (bl) {
      gap_end = std::min(end, bl->offset + bl->len);
    } else if (it != idx.end()) {
      gap_end = std::min(end, blocks[*it].offset);
    }
    lk.unlock();
    WL_RETURN_IF_ERROR(fill(pos, dst.subspan(static_cast<size_t>(pos - off), static_cast<size_t>(gap_end - pos))));
    pos = gap_end;
  }
  return Status();
}

bool ReadAhead::State::any_staged(size_t fi, uint64_t off, uint64_t n) {
  std::lock_guard lk(mu);
  std::vector<size_t> pending;
  for (size_t bi : file_blocks[fi]) {
    const Block& b = blocks[bi];
    if (b.offset >= off + n || b.offset + b.len <= off) continue;
    if (b.state == BlockState::kInFlight || (b.state == BlockState::kStaged && b.data.size() > 0)) return true;
    if (b.state == BlockState::kPending) pending.push_back(bi);
  }
  for (size_t bi : pending) blocks[bi].state = BlockState::kSkipped;
  if (!pending.empty()) overtaken();
  return false;
}

void ReadAhead::State::overtaken() {
  if (!p.overtaken) p.overtaken_at = p.bytes_read;
  p.overtaken = true;
  stop.store(true);
  cv.notify_all();
}

size_t ReadAhead::State::file_index(const std::string& path, const std::string& version) {
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return p.planned || p.done; });
  if (!p.remote) return SIZE_MAX;
  for (size_t fi = 0; fi < files.size() && fi < versions.size(); ++fi)
    if (files[fi] == path) return versions[fi] == version && !version.empty() ? fi : SIZE_MAX;
  return SIZE_MAX;
}

// ---- the face ----------------------------------------------------------------------------------

Result<std::unique_ptr<ReadAhead>> ReadAhead::start(std::vector<std::string> files, ReadAheadOptions options) {
  if (files.empty()) return Status::InvalidArgument("read-ahead: no files");
  if (options.env == nullptr) return Status::InvalidArgument("read-ahead: no Env");
  if (options.threads < 0) return Status::InvalidArgument(fmt::format("read-ahead: threads {} < 0", options.threads));
  if (options.block_size > (uint64_t{1} << 30)) return Status::InvalidArgument("read-ahead: block size above 1 GiB");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return Status::InvalidArgument(
        fmt::format("read-ahead: rank {} is outside [0, {})", options.rank, options.world_size));
  auto s = std::make_shared<State>();
  s->files = std::move(files);
  s->o = std::move(options);
  s->env = std::make_unique<StagedEnv>(s->o.env, s.get());
  s->job = std::thread([st = s.get()] {
    Status planned = st->plan();
    if (!planned.ok()) {
      st->fail(std::move(planned));
    } else {
      st->read_blocks();
    }
    st->seconds.store(std::chrono::duration<double>(Clock::now() - st->t0).count());
    std::lock_guard lk(st->mu);
    st->p.done = true;
    st->cv.notify_all();
  });
  return std::unique_ptr<ReadAhead>(new ReadAhead(std::move(s)));
}

ReadAhead::~ReadAhead() {
  stop();
  if (s_->job.joinable()) s_->job.join();
}

void ReadAhead::stop() {
  s_->stop.store(true);
  std::lock_guard lk(s_->mu);
  s_->cv.notify_all();
}

Status ReadAhead::wait() {
  std::unique_lock lk(s_->mu);
  s_->cv.wait(lk, [&] { return s_->p.done; });
  return s_->status;
}

ReadAheadProgress ReadAhead::progress() const {
  std::lock_guard lk(s_->mu);
  ReadAheadProgress p = s_->p;
  double sec = s_->seconds.load();
  p.seconds = sec >= 0 ? sec : std::chrono::duration<double>(Clock::now() - s_->t0).count();
  return p;
}

ReadAheadProgress ReadAhead::wait_planned() const {
  {
    std::unique_lock lk(s_->mu);
    s_->cv.wait(lk, [&] { return s_->p.planned || s_->p.done; });
  }
  return progress();
}

Env* ReadAhead::env() { return s_->env.get(); }

// ---- populate_read -------------------------------------------------------------------------------

// Threads paging mapped ranges in when the caller names none (as a read-ahead
// of local files pages them in: choose()'s read-ahead row).
constexpr int kPopulateThreads = 4;

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace {

struct Chunk {
  size_t range;
  uintptr_t begin, end;  // page-aligned
};

// Pages of [begin, end) the page cache holds (mincore); 0 when it cannot tell.
uint64_t resident_pages(uintptr_t begin, uintptr_t end, uintptr_t page) {
  std::vector<unsigned char> vec((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()) != 0) return 0;
  uint64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

Status populate_chunk(const Chunk& c, uintptr_t page) {
  if (::madvise(reinterpret_cast<void*>(c.begin), c.end - c.begin, MADV_POPULATE_READ) == 0) return Status();
  const int err = errno;
  if (err == EINVAL) {  // a kernel without MADV_POPULATE_READ: a read per page
    for (uintptr_t a = c.begin; a < c.end; a += page) (void)*reinterpret_cast<volatile const std::byte*>(a);
    return Status();
  }
  if (err == EFAULT)
    return Status::IoError(
        fmt::format("range {}: its pages cannot be read (the file under the mapping was "
                    "truncated, or reading it failed)",
                    c.range));
  return Status::FromErrno(err, fmt::format("range {}: populating its pages", c.range));
}

}  // namespace

Result<PopulateStats> populate_read(std::span<const MappedRange> ranges, int threads) {
  if (threads < 0) return Status::InvalidArgument(fmt::format("populate_read: threads {} < 0", threads));
  const auto t0 = Clock::now();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  constexpr uintptr_t kStep = uintptr_t{8} << 20;  // bytes per chunk (a multiple of the page size)
  PopulateStats st;
  std::vector<Chunk> chunks;
  std::vector<size_t> range_ends;  // chunks cut where a range ends: a run never spans two
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].size == 0) continue;
    if (ranges[i].data == nullptr) return Status::InvalidArgument(fmt::format("populate_read: range {} is null", i));
    st.bytes += ranges[i].size;
    const auto a = reinterpret_cast<uintptr_t>(ranges[i].data) / page * page;
    const auto b = (reinterpret_cast<uintptr_t>(ranges[i].data) + ranges[i].size + page - 1) / page * page;
    for (uintptr_t x = a; x < b; x += kStep) chunks.push_back({i, x, std::min(b, x + kStep)});
    range_ends.push_back(chunks.size());
  }
  // Counted before any populating: a chunk's faults make the kernel read ahead into the next
  // chunks' pages, which a count taken by each worker would then miss.
  uint64_t missing = 0;
  for (const Chunk& c : chunks) {
    const uint64_t pages = (c.end - c.begin) / page;
    missing += (pages - std::min(resident_pages(c.begin, c.end, page), pages)) * page;
  }
  // Each thread pages in runs of a range's consecutive chunks, as the read-ahead reads its blocks.
  WL_RETURN_IF_ERROR(run_in_order_until_error(cut_runs(range_ends, kRunBlocks), threads ? threads : kPopulateThreads,
                                              [&](size_t, size_t ci) { return populate_chunk(chunks[ci], page); }));
  st.bytes_not_resident = std::min(missing, st.bytes);
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

}  // namespace wl

// choose() (read_path.h) as a table: one row per rule, each row a request,
// the facts on hand, and the read path (or error) it must give.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "weightlift/read_path.h"

namespace wl {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kColdViewsMemory = uint64_t{256} << 20;
const Device kCuda0{DeviceKind::kCuda, 0};

// The facts of a row; counts how often each is asked (at most once, and only when a rule needs it).
struct Facts final : ReadFacts {
  std::optional<double> cached;  // nullopt: residency cannot be told
  bool cached_fails = false;
  std::string fstype = "ext4";
  uint64_t bytes = kGiB, available = 64 * kGiB;
  bool bytes_fail = false;
  std::optional<bool> whole = true;
  std::string gds_refusal;  // "" = usable
  int asked[6] = {};

  Result<std::optional<double>> cached_fraction() override {
    ++asked[0];
    if (cached_fails) return Status::Aborted("changed since it was planned").with_file("a.safetensors");
    return cached;
  }
  std::string fs_type() override { return ++asked[1], fstype; }
  Result<uint64_t> checkpoint_bytes() override {
    ++asked[2];
    if (bytes_fail) return Status::NotFound("no such file").with_file("a.safetensors");
    return bytes;
  }
  Result<uint64_t> available_memory() override { return ++asked[3], available; }
  std::optional<bool> contiguous() override { return ++asked[4], whole; }
  Result<bool> gds_usable(std::string* why) override {
    ++asked[5];
    *why = gds_refusal;
    return gds_refusal.empty();
  }
};

struct Row {
  const char* rule;
  ReadRequest rq;
  Facts facts;
  // The path: strategy, O_DIRECT, file views, GDS, memory cap, a log line it contains, a warning.
  Strategy strategy = Strategy::kLazy;
  bool direct = false, views = false, gds = false;
  uint64_t max_memory = 0;
  const char* log = nullptr;
  bool warn = false;
  Code error = Code::kOk;  // or the error instead of a path
  bool ordered = false;    // tensors handed over in checkpoint order
};

ReadRequest local(Strategy s, bool views = false) {
  return {.first_file = "/m/a.safetensors", .strategy = s, .file_views = views};
}
ReadRequest with(ReadRequest r, auto&& edit) {
  edit(r);
  return r;
}
Facts residency(std::optional<double> cached) {
  Facts f;
  f.cached = cached;
  return f;
}

// One rule a row, its fields in Row's order.
// clang-format off
std::vector<Row> rows() {
  std::vector<Row> t;
  // ---- distributed ----
  t.push_back({"distributed always streams", with(local(Strategy::kLazy), [](auto& r) { r.distributed = true; }),
               residency(1.0), Strategy::kStream});
  // ---- auto ----
  t.push_back({"auto into device memory streams",
               with(local(Strategy::kAuto), [](auto& r) { r.dest = DestKind::kDevice, r.device = kCuda0; }),
               residency(1.0), Strategy::kStream, false, false, false, 0, "auto: stream (a cuda:0 destination)"});
  t.push_back({"auto on arriving files into engine memory: lazy with file views",
               with(local(Strategy::kAuto), [](auto& r) { r.source = SourceKind::kArriving; }), {}, Strategy::kLazy,
               false, true});
  t.push_back({"auto on arriving files into a destination: stream",
               with(local(Strategy::kAuto), [](auto& r) { r.source = SourceKind::kArriving, r.dest = DestKind::kCaller; }),
               {}, Strategy::kStream});
  t.push_back({"auto into the caller's memory streams",
               with(local(Strategy::kAuto), [](auto& r) { r.dest = DestKind::kCaller; }), residency(1.0),
               Strategy::kStream, false, false, false, 0, "auto: stream (the caller's memory"});
  t.push_back({"auto with no files: lazy", ReadRequest{}, {}, Strategy::kLazy, false, false, false, 0,
               "auto: no files; lazy"});
  t.push_back({"auto on URLs streams",
               {.source = SourceKind::kRemote, .first_file = "s3://b/m/a.safetensors"}, {}, Strategy::kStream, false,
               false, false, 0, "auto: stream (s3:// is a remote source"});
  {
    Facts nfs;
    nfs.fstype = "nfs";
    t.push_back({"auto on a network filesystem that fits: prefetch", local(Strategy::kAuto), nfs, Strategy::kPrefetch,
                 false, false, false, 0, "auto: prefetch (filesystem nfs"});
    nfs.available = kGiB;
    t.push_back({"auto on a network filesystem past 90% of RAM: lazy, warned", local(Strategy::kAuto), nfs,
                 Strategy::kLazy, false, false, false, 0, "exceeds 90% of RAM", true});
  }
  t.push_back({"auto on a local filesystem: lazy", local(Strategy::kAuto), {}, Strategy::kLazy, false, false, false, 0,
               "not a network filesystem"});
  {
    Facts missing;
    missing.bytes_fail = true;
    t.push_back({"auto with a fact missing: lazy, the reason logged", local(Strategy::kAuto), missing,
                 Strategy::kLazy, false, false, false, 0, "auto: lazy (a.safetensors: no such file)"});
  }
  // ---- a per-file strategy into device memory ----
  auto into_device = [](Strategy s) {
    return with(local(s), [](auto& r) { r.dest = DestKind::kDevice, r.device = kCuda0, r.direct = Toggle::kOff; });
  };
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch})
    t.push_back({"lazy / eager / prefetch into device memory: the stream, in file order", into_device(s), {},
                 Strategy::kStream, false, false, false, 0, "the stream strategy instead (a cuda:0 destination",
                 false, Code::kOk, true});
  t.push_back({"threads into device memory: the stream, in any order", into_device(Strategy::kThreads), {},
               Strategy::kStream, false, false, false, 0, "threads: the stream strategy instead"});
  t.push_back({"a per-file strategy into device memory keeps GDS",
               with(into_device(Strategy::kLazy), [](auto& r) { r.gds = Toggle::kAuto; }), {}, Strategy::kStream,
               false, false, true, 0, "GPUDirect Storage (cuFile) reads into device memory", false, Code::kOk, true});
  t.push_back({"a per-file strategy into device memory as asked (WEIGHTLIFT_DEVICE_STRATEGY=asked)",
               with(into_device(Strategy::kEager), [](auto& r) { r.device_as_asked = true; }), {}, Strategy::kEager});
  t.push_back({"a per-file strategy into pinned memory runs as asked",
               with(local(Strategy::kLazy), [](auto& r) { r.dest = DestKind::kPinned; }), {}, Strategy::kLazy});
  // ---- prefetch asked for ----
  {
    Facts small;
    small.available = kGiB;
    t.push_back({"prefetch asked for past 90% of RAM: prefetch, warned", local(Strategy::kPrefetch), small,
                 Strategy::kPrefetch, false, false, false, 0, "prefetch requested although", true});
  }
  // ---- file views ----
  t.push_back({"file views into engine memory", local(Strategy::kLazy, true), residency(0.9), Strategy::kLazy, false,
               true});
  t.push_back({"no file views into the caller's memory",
               with(local(Strategy::kLazy, true), [](auto& r) { r.dest = DestKind::kCaller; }), residency(0.9),
               Strategy::kLazy});
  t.push_back({"no file views into pinned memory",
               with(local(Strategy::kEager, true), [](auto& r) { r.dest = DestKind::kPinned; }), residency(0.9),
               Strategy::kEager});
  t.push_back({"no file views for the stream strategy", local(Strategy::kStream, true), residency(0.9),
               Strategy::kStream});
  t.push_back({"file views while prefetching", local(Strategy::kPrefetch, true), residency(0.0), Strategy::kPrefetch,
               false, true, false, 0, "prefetch (filesystem ext4"});
  // ---- cold views ----
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kThreads})
    t.push_back({"file views of cold files: stream with O_DIRECT under 256 MiB", local(s, true), residency(0.1),
                 Strategy::kStream, true, false, false, kColdViewsMemory});
  t.push_back({"cold views keep the caller's memory cap",
               with(local(Strategy::kLazy, true), [](auto& r) { r.max_memory = 1 << 20; }), residency(0.1),
               Strategy::kStream, true, false, false, 1 << 20});
  t.push_back({"cold views with direct off stay views",
               with(local(Strategy::kLazy, true), [](auto& r) { r.direct = Toggle::kOff; }), residency(0.1),
               Strategy::kLazy, false, true});
  {
    Facts split = residency(0.1);
    split.whole = false;
    t.push_back({"cold views with a tensor not contiguous stay views", local(Strategy::kLazy, true), split,
                 Strategy::kLazy, false, true});
    split.whole = std::nullopt;
    t.push_back({"cold views before planning stay views", local(Strategy::kLazy, true), split, Strategy::kLazy,
                 false, true});
  }
  t.push_back({"cold views when residency cannot be told stay views", local(Strategy::kLazy, true),
               residency(std::nullopt), Strategy::kLazy, false, true});
  {
    Facts broken;
    broken.cached_fails = true;
    t.push_back({"cold views when a file cannot be sampled stay views (it fails where it is read)",
                 local(Strategy::kLazy, true), broken, Strategy::kLazy, false, true});
  }
  // ---- O_DIRECT for the stream ----
  t.push_back({"stream: direct on", with(local(Strategy::kStream), [](auto& r) { r.direct = Toggle::kOn; }),
               residency(1.0), Strategy::kStream, true});
  t.push_back({"stream: direct off", with(local(Strategy::kStream), [](auto& r) { r.direct = Toggle::kOff; }),
               residency(0.0), Strategy::kStream, false});
  t.push_back({"stream: direct auto on cold files", local(Strategy::kStream), residency(0.3), Strategy::kStream, true});
  t.push_back({"stream: direct auto on warm files", local(Strategy::kStream), residency(0.7), Strategy::kStream,
               false});
  t.push_back({"stream: direct auto when residency cannot be told", local(Strategy::kStream), residency(std::nullopt),
               Strategy::kStream, false});
  t.push_back({"stream: never direct for URLs",
               {.source = SourceKind::kRemote, .first_file = "https://h/a.safetensors", .strategy = Strategy::kStream,
                .direct = Toggle::kOn},
               {}, Strategy::kStream, false});
  {
    Facts broken;
    broken.cached_fails = true;
    t.push_back({"stream: direct auto when a file cannot be sampled is the file's error", local(Strategy::kStream),
                 broken, Strategy::kStream, false, false, false, 0, nullptr, false, Code::kAborted});
  }
  // ---- GPUDirect Storage ----
  auto device_stream = [](Toggle gds) {
    return with(local(Strategy::kStream), [gds](auto& r) {
      r.dest = DestKind::kDevice, r.device = kCuda0, r.gds = gds, r.direct = Toggle::kOff;
    });
  };
  t.push_back({"GDS off as wished", device_stream(Toggle::kOff), {}, Strategy::kStream, false, false, false, 0,
               "GPUDirect Storage off: gds=off"});
  t.push_back({"GDS auto where cuFile reads the file", device_stream(Toggle::kAuto), {}, Strategy::kStream, false,
               false, true, 0, "GPUDirect Storage (cuFile) reads into device memory"});
  {
    Facts refused;
    refused.gds_refusal = "the filesystem does not support GPUDirect Storage";
    t.push_back({"GDS auto refused: the ring, the reason logged", device_stream(Toggle::kAuto), refused,
                 Strategy::kStream, false, false, false, 0, "GPUDirect Storage off: the filesystem does not support"});
    t.push_back({"GDS on refused: an error naming the file, before any read", device_stream(Toggle::kOn), refused,
                 Strategy::kStream, false, false, false, 0, nullptr, false, Code::kUnimplemented});
  }
  t.push_back({"GDS only into device memory",
               with(local(Strategy::kStream), [](auto& r) { r.gds = Toggle::kOn, r.direct = Toggle::kOff; }), {},
               Strategy::kStream});
  t.push_back({"GDS only for the stream strategy",
               with(device_stream(Toggle::kOn), [](auto& r) { r.strategy = Strategy::kLazy, r.device_as_asked = true; }),
               {}, Strategy::kLazy});
  return t;
}
// clang-format on

TEST(ReadPath, EveryRule) {
  for (Row& row : rows()) {
    SCOPED_TRACE(row.rule);
    auto p = choose(row.rq, row.facts);
    for (int n : row.facts.asked) EXPECT_LE(n, 1) << "a fact asked twice";
    if (row.error != Code::kOk) {
      ASSERT_FALSE(p.ok());
      EXPECT_EQ(p.status().code(), row.error) << p.status().to_string();
      EXPECT_FALSE(p.status().file().empty()) << p.status().to_string();  // names the file
      continue;
    }
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(strategy_name(p->strategy), strategy_name(row.strategy));
    EXPECT_EQ(p->direct, row.direct);
    EXPECT_EQ(p->file_views, row.views);
    EXPECT_EQ(p->gds, row.gds);
    EXPECT_EQ(p->max_memory, row.max_memory);
    EXPECT_EQ(p->warn, row.warn);
    EXPECT_EQ(p->ordered, row.ordered);
    if (row.log) {
      bool found = false;
      for (const auto& l : p->log) found |= l.find(row.log) != std::string::npos;
      EXPECT_TRUE(found) << "no log line with '" << row.log << "' in " << ::testing::PrintToString(p->log);
    }
  }
}

TEST(ReadPath, FactsAreAskedOnlyWhenARuleNeedsThem) {
  Facts f;
  ASSERT_TRUE(choose({.source = SourceKind::kRemote, .first_file = "s3://b/a.safetensors"}, f).ok());
  for (int n : f.asked) EXPECT_EQ(n, 0);  // a URL: no filesystem, memory or residency to ask about
  Facts g;
  ASSERT_TRUE(choose(local(Strategy::kLazy), g).ok());
  for (int n : g.asked) EXPECT_EQ(n, 0);  // lazy without views: nothing to decide
}

TEST(ReadPath, GdsRequiredButUnusableSaysWhy) {
  Facts refused;
  refused.gds_refusal = "cuFile is not usable: libcufile.so.0 not found";
  ReadRequest rq = local(Strategy::kStream);
  rq.dest = DestKind::kDevice, rq.device = kCuda0, rq.gds = Toggle::kOn;
  auto p = choose(rq, refused);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "gds=on: GPUDirect Storage cannot be used: cuFile is not usable: libcufile.so.0 not found");
  EXPECT_EQ(p.status().file(), "/m/a.safetensors");
}

TEST(ReadPath, GivenFactsFallBackToTheRest) {
  Facts rest;
  rest.fstype = "lustre";
  GivenFacts given(&rest);
  given.bytes = 10;
  given.available = 100;
  auto p = choose(local(Strategy::kAuto), given);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->strategy, Strategy::kPrefetch);  // lustre (from the rest), 10 bytes of 100 (given)
  ASSERT_TRUE(p->prefetch.has_value());
  EXPECT_EQ(p->prefetch->fstype, "lustre");
  EXPECT_EQ(p->prefetch->checkpoint_bytes, 10u);
  EXPECT_EQ(rest.asked[2], 0);  // the given size, not the rest's
  GivenFacts none;              // nothing known: lazy, the missing fact named
  auto q = choose(local(Strategy::kAuto), none);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->strategy, Strategy::kLazy);
  EXPECT_NE(q->log[0].find("auto: lazy (the checkpoint's size is not known)"), std::string::npos) << q->log[0];
}

TEST(ReadPath, ModeNames) {
  for (Strategy s :
       {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch, Strategy::kAuto, Strategy::kThreads, Strategy::kStream})
    EXPECT_EQ(strategy_from_name(strategy_name(s)), s);
  for (Toggle t : {Toggle::kAuto, Toggle::kOn, Toggle::kOff}) EXPECT_EQ(toggle_from_name(toggle_name(t)), t);
  EXPECT_FALSE(strategy_from_name("fast").has_value());
  EXPECT_FALSE(toggle_from_name("yes").has_value());
}

// ---- the sizes and the copy source (what the runners used to decide) ----------------------

// Facts with the machine's cores, the destination's uploader and the bytes to read given.
struct Sized final : ReadFacts {
  std::optional<double> cached = 1.0;
  unsigned ncores = 4;
  std::optional<UploaderFacts> up;
  uint64_t bytes = uint64_t{1} << 30;
  int asked_cached = 0;
  Result<std::optional<double>> cached_fraction() override { return ++asked_cached, cached; }
  std::string fs_type() override { return "ext4"; }
  Result<uint64_t> checkpoint_bytes() override { return bytes; }
  Result<uint64_t> available_memory() override { return 64 * kGiB; }
  std::optional<bool> contiguous() override { return true; }
  Result<bool> gds_usable(std::string* why) override {
    *why = "no cuFile here";
    return false;
  }
  unsigned cores() override { return ncores; }
  std::optional<UploaderFacts> uploader() override { return up; }
  uint64_t stream_bytes() override { return bytes; }
};

UploaderFacts ring(uint32_t slots, uint64_t slot_bytes, bool registration) {
  UploaderFacts u;
  u.present = true;
  u.slot_count = slots;
  u.slot_bytes = slot_bytes;
  u.host_registration = registration;
  return u;
}

ReadRequest stream_into(DestKind dest, Toggle direct = Toggle::kOff) {
  ReadRequest r = local(Strategy::kStream);
  r.dest = dest;
  if (dest == DestKind::kDevice) r.device = kCuda0;
  r.direct = direct;
  return r;
}

TEST(ReadPath, StreamThreadsAndReadSize) {
  Sized f;
  f.ncores = 4;
  auto buffered = choose(stream_into(DestKind::kHost), f);
  ASSERT_TRUE(buffered.ok());
  EXPECT_EQ(buffered->stream.threads, 4);  // one per core for copies out of the page cache
  EXPECT_EQ(buffered->stream.read_size, uint64_t{8} << 20);
  EXPECT_EQ(buffered->stream.window, 0u);
  f.ncores = 64;
  EXPECT_EQ(choose(stream_into(DestKind::kHost), f)->stream.threads, 8);  // at most 8
  f.ncores = 1;
  EXPECT_EQ(choose(stream_into(DestKind::kHost), f)->stream.threads, 2);  // at least 2
  auto direct = choose(stream_into(DestKind::kHost, Toggle::kOn), f);
  EXPECT_EQ(direct->stream.threads, 8);  // O_DIRECT: reads in flight
  EXPECT_EQ(direct->stream.staging, 8 * ((uint64_t{8} << 20) + 8192));
  ReadRequest url{.source = SourceKind::kRemote, .first_file = "s3://b/a.safetensors", .strategy = Strategy::kStream};
  EXPECT_EQ(choose(url, f)->stream.threads, 16);  // requests in flight
  ReadRequest asked = stream_into(DestKind::kHost);
  asked.threads = 5, asked.block_size = 1 << 20;
  auto as_asked = choose(asked, f);
  EXPECT_EQ(as_asked->stream.threads, 5);
  EXPECT_EQ(as_asked->stream.read_size, uint64_t{1} << 20);
  f.bytes = 3 << 20;  // three reads: three threads
  EXPECT_EQ(choose(asked, f)->stream.threads, 3);
  f.bytes = 0;  // not known: as sized
  EXPECT_EQ(choose(asked, f)->stream.threads, 5);
}

TEST(ReadPath, StreamMemoryCapSplitsIntoStagingAndWindow) {
  Sized f;
  ReadRequest r = stream_into(DestKind::kHost, Toggle::kOn);
  r.max_memory = 32 << 20;
  auto p = choose(r, f);
  ASSERT_TRUE(p.ok());
  const StreamSetup& s = p->stream;
  EXPECT_LE(s.staging, uint64_t{16} << 20);  // staging in half the cap
  EXPECT_EQ(s.staging, static_cast<uint64_t>(s.threads) * (s.read_size + 8192));
  EXPECT_EQ(s.window, (uint64_t{32} << 20) - s.staging);
  EXPECT_EQ(s.read_size % 4096, 0u);
  EXPECT_EQ(s.max_memory, uint64_t{32} << 20);
  r.direct = Toggle::kOff;  // buffered: the cap is the window, reads at most half of it
  auto b = choose(r, f);
  EXPECT_EQ(b->stream.window, uint64_t{32} << 20);
  EXPECT_EQ(b->stream.read_size, uint64_t{8} << 20);
  r.max_memory = 4 << 20;
  EXPECT_EQ(choose(r, f)->stream.read_size, uint64_t{2} << 20);
}

TEST(ReadPath, DeviceStreamsAreSizedByTheRing) {
  Sized f;
  f.ncores = 16;
  f.up = ring(12, 1 << 20, false);
  auto p = choose(stream_into(DestKind::kDevice), f);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->stream.threads, 6);                             // one per core, at most half the slots
  EXPECT_EQ(p->stream.read_size, (uint64_t{1} << 20) - 8192);  // an aligned read fits a slot
  EXPECT_EQ(p->stream.slots, 12u);
  EXPECT_NE(p->stream.describe().find("through 12 pinned slots of 1024 KiB"), std::string::npos)
      << p->stream.describe();
  // The uploader's refusals, before any read.
  f.up = UploaderFacts{};
  EXPECT_EQ(choose(stream_into(DestKind::kDevice), f).status().message(), "a cuda:0 destination needs an uploader");
  f.up = ring(8, 8192, false);
  EXPECT_EQ(choose(stream_into(DestKind::kDevice), f).status().code(), Code::kInvalidArgument);
  f.up = ring(8, 1 << 20, false);
  f.up->ready = Status::Unavailable("no CUDA device");
  EXPECT_EQ(choose(stream_into(DestKind::kDevice), f).status().code(), Code::kUnavailable);
}

TEST(ReadPath, CopySourceOfADeviceStream) {
  struct Case {
    const char* rule;
    std::string wish;
    bool registration;
    unsigned cores;
    double cached;
    CopySource want;
    const char* log;
  };
  const Case cases[] = {
      {"auto: a hot checkpoint on few cores copies out of the page cache", "auto", true, 4, 0.95, CopySource::kMapped,
       nullptr},
      {"auto: a warm one goes through the slots", "auto", true, 4, 0.6, CopySource::kSlots, nullptr},
      {"auto: many cores go through the slots", "auto", true, 16, 1.0, CopySource::kSlots, nullptr},
      {"auto: no registration, the slots", "auto", false, 4, 1.0, CopySource::kSlots, nullptr},
      {"slot as set", "slot", true, 4, 1.0, CopySource::kSlots, nullptr},
      {"mapped as set", "mapped", true, 16, 0.0, CopySource::kMapped, nullptr},
      {"mapped set but refused: the slots, said", "mapped", false, 4, 1.0, CopySource::kSlots,
       "cannot register host memory read-only"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rule);
    Sized f;
    f.cached = c.cached;
    f.ncores = c.cores;
    f.up = ring(8, 1 << 20, c.registration);
    ReadRequest r = stream_into(DestKind::kDevice);
    r.h2d_source = c.wish;
    auto p = choose(r, f);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(copy_source_name(p->stream.copy_source), copy_source_name(c.want));
    EXPECT_LE(f.asked_cached, 1);
    if (c.log) {
      bool found = false;
      for (const auto& l : p->log) found |= l.find(c.log) != std::string::npos;
      EXPECT_TRUE(found) << ::testing::PrintToString(p->log);
    }
  }
  // Never with O_DIRECT, GDS or URLs; a bad wish is refused naming the variable, where it is weighed.
  Sized f;
  f.up = ring(8, 1 << 20, true);
  ReadRequest direct = stream_into(DestKind::kDevice, Toggle::kOn);
  direct.h2d_source = "mapped";
  EXPECT_EQ(choose(direct, f)->stream.copy_source, CopySource::kSlots);
  ReadRequest bad = stream_into(DestKind::kDevice);
  bad.h2d_source = "sometimes";
  EXPECT_EQ(choose(bad, f).status().message(), "WEIGHTLIFT_H2D_SOURCE='sometimes' (expected slot, mapped or auto)");
  EXPECT_TRUE(choose(with(bad, [](auto& r) { r.dest = DestKind::kHost; }), f).ok());  // not weighed into host memory
}

TEST(ReadPath, DistributedSplits) {
  Sized f;
  f.ncores = 4;
  ReadRequest r = local(Strategy::kLazy);
  r.distributed = true;
  r.world = 4;
  auto p = choose(r, f);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->exchange_block, uint64_t{32} << 20);  // 4 reads of 8 MiB
  EXPECT_TRUE(p->exchange_arena);                    // host memory of the engine's, a host collective
  EXPECT_EQ(p->scatter_threads, 4);
  EXPECT_EQ(p->stream.max_memory, 0u);
  r.max_memory = 64 << 20;  // own part under half the cap; blocks of two buffers of W in the other half
  auto capped = choose(r, f);
  EXPECT_EQ(capped->stream.max_memory, uint64_t{32} << 20);
  EXPECT_EQ(capped->exchange_block, uint64_t{4} << 20);  // 64 MiB / 4 / 4 ranks
  EXPECT_EQ(capped->exchange_reads.max_memory, 0u);      // the slices land in the exchange buffers
  EXPECT_LE(capped->exchange_reads.threads, 1);          // one read per block of 4 MiB
  r.collective_device = kCuda0;
  EXPECT_FALSE(choose(r, f)->exchange_arena);
  EXPECT_EQ(fit_stream(capped->stream, 1).threads, 1);
}

TEST(ReadPath, PerFileStrategySizes) {
  Sized f;
  ReadRequest threads = local(Strategy::kThreads);
  threads.files = 3;
  EXPECT_EQ(choose(threads, f)->workers, 3);  // at most one per file
  threads.files = 30;
  EXPECT_EQ(choose(threads, f)->workers, 8);
  threads.threads = 12;
  EXPECT_EQ(choose(threads, f)->workers, 12);
  auto pre = choose(local(Strategy::kPrefetch), f);
  EXPECT_EQ(pre->prefetch_threads, kDefaultPrefetchThreads);
  EXPECT_EQ(pre->prefetch_block, kDefaultPrefetchBlockSize);
  ReadRequest asked = local(Strategy::kPrefetch);
  asked.threads = 3, asked.block_size = 1 << 20;
  EXPECT_EQ(choose(asked, f)->prefetch_threads, 3);
  EXPECT_EQ(choose(asked, f)->prefetch_block, uint64_t{1} << 20);
}

TEST(ReadPath, ReadAheadSizes) {
  Sized f;
  ReadRequest r = local(Strategy::kAuto);
  r.read_ahead = true;
  auto local_ahead = choose(r, f);
  ASSERT_TRUE(local_ahead.ok()) << local_ahead.status().to_string();
  EXPECT_FALSE(local_ahead->read_ahead.remote);
  EXPECT_EQ(local_ahead->read_ahead.threads, 4);  // paging local files in
  EXPECT_EQ(local_ahead->read_ahead.block, uint64_t{8} << 20);
  EXPECT_EQ(local_ahead->read_ahead.max_memory, 64 * kGiB / 2);  // half the available RAM
  ReadRequest url{.source = SourceKind::kRemote, .first_file = "s3://b/a.safetensors"};
  url.read_ahead = true;
  auto staged = choose(url, f);
  EXPECT_TRUE(staged->read_ahead.remote);
  EXPECT_EQ(staged->read_ahead.threads, 16);                // connections staging remote bytes
  EXPECT_EQ(staged->read_ahead.max_memory, 64 * kGiB / 4);  // a quarter of it
  url.threads = 3, url.block_size = 1 << 20, url.max_memory = 5 << 20;
  auto asked = choose(url, f);
  EXPECT_EQ(asked->read_ahead.threads, 3);
  EXPECT_EQ(asked->read_ahead.block, uint64_t{1} << 20);
  EXPECT_EQ(asked->read_ahead.max_memory, uint64_t{5} << 20);
  EXPECT_EQ(choose(local(Strategy::kAuto), f)->read_ahead.threads, 0);  // only when asked
}

}  // namespace
}  // namespace wl

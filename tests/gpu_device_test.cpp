// The GPU destination on the host fake backend (src/gpu/fake.h): the very
// ring, copier, uploader, destinations and GDS code that runs on a GPU, with
// host memory standing for device memory (at addresses the host cannot
// touch), threads for streams and condition variables for events. Tests whose
// names match *Stream* / *Concurren* also run under TSan (scripts/test).
#include <gtest/gtest.h>

#include <sys/sysmacros.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "engine_test_util.h"
#include "gpu/fake.h"
#include "gpu/gds_platform.h"
#include "gpu/ring.h"
#include "io/posix_internal.h"
#include "test_util.h"
#include "weightlift/dummy.h"
#include "weightlift/gpu.h"

namespace wl {
namespace {

using testing::load_all;
using testing::make_f32;
using testing::TempDir;
using testing::write_st;

constexpr uint64_t kSlot = 64 << 10;  // small slots: tensors span several

using testing::ScopedEnv;

// Installs a fresh fake backend (4 slots of 64 KiB) for each test, and puts
// the machine's own backend back afterwards.
class FakeGpu : public ::testing::Test {
 protected:
  void install(gpu::fake::Options o = {}) {
    gpu::fake::install(o);
    ASSERT_TRUE(gpu::set_ring_options({4, kSlot, 2}).ok());
  }
  void SetUp() override { install(); }
  void TearDown() override { gpu::fake::uninstall(); }
  gpu::fake::Stats& stats() { return gpu::fake::stats(); }
};

// A checkpoint of three files: empty, tiny, slot-sized and multi-slot tensors.
std::vector<std::string> make_checkpoint(const TempDir& dir) {
  std::vector<std::string> files = {dir.file("a.safetensors"), dir.file("b.safetensors"), dir.file("c.safetensors")};
  write_st(files[0], {{"a.empty", make_f32({0}, 1)}, {"a.tiny", make_f32({3}, 2)}, {"a.big", make_f32({300, 257}, 3)}});
  write_st(files[1], {{"b.slot", make_f32({16384}, 4)}, {"b.rows", make_f32({64, 96}, 5)}});
  write_st(files[2],
           {{"c.one", make_f32({1}, 6)}, {"c.wide", make_f32({8, 40000}, 7)}, {"c.last", make_f32({5, 5}, 8)}});
  return files;
}

// name -> bytes, copying device tensors back.
Result<std::map<std::string, std::string>> load_back(const std::vector<std::string>& files, const LoadOptions& o,
                                                     LoadStats* stats = nullptr,
                                                     std::vector<uint64_t>* order = nullptr) {
  std::map<std::string, std::string> out;
  auto r = load_files(files, o, [&](LoadedTensor&& t) -> Status {
    std::string bytes(t.view.nbytes(), '\0');
    WL_RETURN_IF_ERROR(gpu::copy_to_host(t.view, std::as_writable_bytes(std::span(bytes.data(), bytes.size()))));
    if (order) order->push_back(t.ordinal);
    out[t.name] = std::move(bytes);
    return Status();
  });
  if (!r.ok()) return r.status();
  if (stats) *stats = *r;
  return out;
}

TEST(GpuDetect, WithoutAGpuTheErrorNamesWhatIsMissing) {
  gpu::fake::uninstall();
  if (gpu::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const std::string why = gpu::unavailable_reason();
  EXPECT_TRUE(why.find("NVIDIA driver") != std::string::npos || why.find("CUDA device") != std::string::npos ||
              why.find("CUDA runtime") != std::string::npos)
      << why;
  EXPECT_TRUE(gpu::check_device(kCpu).ok());
  for (Device d : {Device{DeviceKind::kCuda, 0}, Device{DeviceKind::kCudaHost, 0}}) {
    Status s = gpu::check_device(d);
    EXPECT_EQ(s.code(), Code::kUnavailable);
    EXPECT_EQ(s.message(), why);
  }
  EXPECT_EQ(gpu::cuda_destination({DeviceKind::kCuda, 0}).status().code(), Code::kUnavailable);
  EXPECT_EQ(gpu::pinned_destination().status().code(), Code::kUnavailable);
  EXPECT_EQ(gpu::make_uploader({DeviceKind::kCuda, 0}).status().code(), Code::kUnavailable);
  EXPECT_EQ(gpu::DeviceBuffer::allocate(64).status().code(), Code::kUnavailable);
}

TEST_F(FakeGpu, DevicesOrdinalsAndRingOptions) {
  install({.devices = 2});
  EXPECT_EQ(gpu::device_count(), 2);
  EXPECT_EQ(gpu::unavailable_reason(), "");
  EXPECT_TRUE(gpu::check_device({DeviceKind::kCuda, 1}).ok());
  Status s = gpu::check_device({DeviceKind::kCuda, 2});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "no CUDA device 2 (there are 2)");
  EXPECT_EQ(gpu::cuda_destination(kCpu).status().code(), Code::kInvalidArgument);

  EXPECT_EQ(gpu::set_ring_options({1, kSlot, 2}).code(), Code::kInvalidArgument);
  EXPECT_EQ(gpu::set_ring_options({4, 1000, 2}).code(), Code::kInvalidArgument);
  auto up = gpu::make_uploader({DeviceKind::kCuda, 1});  // creates the ring
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  EXPECT_EQ((*up)->slot_bytes(), kSlot);
  Status late = gpu::set_ring_options({8, kSlot, 2});
  EXPECT_EQ(late.code(), Code::kInvalidArgument);
  EXPECT_NE(late.message().find("already exists"), std::string::npos);
}

TEST_F(FakeGpu, RingOptionsFromTheEnvironment) {
  gpu::fake::install({});  // no set_ring_options: the variable decides
  ::setenv(gpu::kRingEnv, "3x128KiB", 1);
  auto o = gpu::ring_options();
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->slots, 3u);
  EXPECT_EQ(o->slot_bytes, uint64_t{128} << 10);
  ::setenv(gpu::kRingEnv, "lots", 1);
  EXPECT_EQ(gpu::ring_options().status().message(),
            "WEIGHTLIFT_PINNED_RING='lots' (expected SLOTSxSIZE[xSTREAMS], e.g. 8x8MiB)");
  ::setenv(gpu::kRingEnv, "32x8MiBx4", 1);
  o = gpu::ring_options();
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->slots, 32u);
  EXPECT_EQ(o->streams, 4);
  ::setenv(gpu::kRingEnv, "8x8MiBx9", 1);
  EXPECT_NE(gpu::ring_options().status().message().find("9 copy streams is outside 1..8"), std::string::npos);
  ::setenv(gpu::kRingEnv, "100x1MiB", 1);
  EXPECT_NE(gpu::ring_options().status().message().find("100 slots is outside 2..64"), std::string::npos);
  ::unsetenv(gpu::kRingEnv);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  EXPECT_EQ(gpu::ring_options()->slots,
            gpu::machine_ring_options(std::thread::hardware_concurrency(), uint64_t(pages) * uint64_t(page)).slots);
}

// Fills a slot with a pattern, copies it to device memory at `dst`.
Status upload_pattern(Uploader& up, std::byte* dst, uint64_t n, uint8_t seed, std::function<void(Status)> done) {
  WL_ASSIGN_OR_RETURN(StagingSlot slot, up.acquire());
  for (uint64_t i = 0; i < n; ++i) slot.bytes[i] = std::byte(static_cast<uint8_t>(seed + i * 7));
  UploadCopy c{0, dst, n};
  return up.submit(slot, std::span(&c, 1), std::move(done));
}

TEST_F(FakeGpu, StreamRingCompletesInOrderAndReusesSlotsOnlyAfterTheirEvent) {
  install({.copy_delay = std::chrono::microseconds(300)});
  auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
  ASSERT_TRUE(up.ok());
  constexpr int kN = 64;
  auto buf = gpu::DeviceBuffer::allocate(kN * kSlot);
  ASSERT_TRUE(buf.ok());
  std::vector<int> completed;
  std::mutex mu;
  for (int i = 0; i < kN; ++i) {
    auto* dst = static_cast<std::byte*>(buf->data()) + static_cast<uint64_t>(i) * kSlot;
    ASSERT_TRUE(upload_pattern(**up, dst, kSlot, static_cast<uint8_t>(i), [&, i](Status s) {
                  EXPECT_TRUE(s.ok());
                  std::lock_guard lk(mu);
                  completed.push_back(i);
                }).ok());
  }
  ASSERT_TRUE((*up)->flush().ok());
  ASSERT_EQ(completed.size(), size_t{kN});
  for (int i = 0; i < kN; ++i) EXPECT_EQ(completed[static_cast<size_t>(i)], i);  // submission order
  // Every slot was rewritten 16 times while copies were slow: never before its event.
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  EXPECT_EQ(stats().pageable_async_copies.load(), 0u);
  std::vector<std::byte> back(kN * kSlot);
  ASSERT_TRUE(buf->copy_to_host(back).ok());
  for (int i = 0; i < kN; ++i)
    for (uint64_t j = 0; j < kSlot; j += 4093)
      ASSERT_EQ(back[static_cast<size_t>(i) * kSlot + j], std::byte(static_cast<uint8_t>(i + j * 7)));
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
}

TEST_F(FakeGpu, StreamRingOverwriteDetectorCatchesAnEarlyReuse) {
  // The negative control of the test above: a slot written while its copy
  // is still queued is seen by the fake.
  install({.copy_delay = std::chrono::milliseconds(20)});
  auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
  auto buf = gpu::DeviceBuffer::allocate(kSlot);
  ASSERT_TRUE(up.ok() && buf.ok());
  auto slot = (*up)->acquire();
  ASSERT_TRUE(slot.ok());
  UploadCopy c{0, static_cast<std::byte*>(buf->data()), kSlot};
  ASSERT_TRUE((*up)->submit(*slot, std::span(&c, 1), [](Status) {}).ok());
  std::memset(slot->bytes.data(), 0x5a, 16);  // breaks the contract on purpose
  ASSERT_TRUE((*up)->flush().ok());
  EXPECT_EQ(stats().slot_overwrites.load(), 1u);
}

TEST_F(FakeGpu, ConcurrentUploadersShareOneRing) {
  install({.copy_delay = std::chrono::microseconds(50)});
  constexpr int kThreads = 6, kEach = 24;
  auto buf = gpu::DeviceBuffer::allocate(kThreads * kEach * kSlot);
  ASSERT_TRUE(buf.ok());
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
      if (!up.ok()) return void(failures++);
      for (int i = 0; i < kEach; ++i) {
        int k = t * kEach + i;
        auto* dst = static_cast<std::byte*>(buf->data()) + static_cast<uint64_t>(k) * kSlot;
        if (!upload_pattern(**up, dst, kSlot, static_cast<uint8_t>(k), [](Status) {}).ok()) failures++;
      }
      if (!(*up)->flush().ok()) failures++;
    });
  for (auto& th : ts) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  std::vector<std::byte> back(kThreads * kEach * kSlot);
  ASSERT_TRUE(buf->copy_to_host(back).ok());
  for (int k = 0; k < kThreads * kEach; ++k)
    ASSERT_EQ(back[static_cast<size_t>(k) * kSlot + 11], std::byte(static_cast<uint8_t>(k + 77)));
  EXPECT_EQ(stats().async_copies.load(), uint64_t{kThreads * kEach});
}

TEST_F(FakeGpu, StreamCancelWakesAWaitingAcquire) {
  auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
  ASSERT_TRUE(up.ok());
  std::vector<StagingSlot> held;
  for (int i = 0; i < 4; ++i) held.push_back(*(*up)->acquire());
  std::atomic<int> code{-1};
  std::thread waiter([&] { code = static_cast<int>((*up)->acquire().status().code()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(code.load(), -1);  // still waiting: every slot is held
  (*up)->cancel();
  waiter.join();
  EXPECT_EQ(code.load(), static_cast<int>(Code::kCancelled));
  for (auto& s : held) (*up)->release(s);
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
}

TEST_F(FakeGpu, StreamCopyErrorReachesDoneAndFlush) {
  install({.fail_copy_at = 3});
  auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
  auto buf = gpu::DeviceBuffer::allocate(8 * kSlot);
  ASSERT_TRUE(up.ok() && buf.ok());
  std::vector<Status> seen(8);
  for (int i = 0; i < 8; ++i) {
    auto* dst = static_cast<std::byte*>(buf->data()) + static_cast<uint64_t>(i) * kSlot;
    ASSERT_TRUE(upload_pattern(**up, dst, kSlot, 1, [&, i](Status s) { seen[static_cast<size_t>(i)] = s; }).ok());
  }
  Status f = (*up)->flush();
  EXPECT_EQ(f.code(), Code::kIoError);
  EXPECT_NE(f.message().find("an illegal memory access was encountered"), std::string::npos) << f.message();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)].ok(), i != 3) << i;
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
}

// ---- loads ------------------------------------------------------------------------------

struct Variant {
  const char* name;
  Strategy strategy;
  Toggle direct = Toggle::kOff;
};
const Variant kVariants[] = {{"lazy", Strategy::kLazy},       {"eager", Strategy::kEager},
                             {"threads", Strategy::kThreads}, {"prefetch", Strategy::kPrefetch},
                             {"stream", Strategy::kStream},   {"stream-direct", Strategy::kStream, Toggle::kOn},
                             {"auto", Strategy::kAuto}};

TEST_F(FakeGpu, StreamDeviceLoadsEqualHostLoadsForEveryStrategy) {
  install({.copy_delay = std::chrono::microseconds(20)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  // Files whose tensors are not all contiguous in the file (views, Fortran order).
  for (const char* f : {"nested.pt", "legacy.bin"})
    files.push_back(std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/data/torch/" + f);
  LoadOptions host;
  host.strategy = Strategy::kLazy;
  auto want = load_all(files, host);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (const char* source : {"slot", "mapped"})
    for (bool one : {true, false}) {
      ScopedEnv h2d("WEIGHTLIFT_H2D_SOURCE", source);  // both roads to the device
      for (const Variant& v : kVariants) {
        auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff, .one_allocation = one});
        ASSERT_TRUE(dest.ok()) << dest.status().to_string();
        LoadOptions o;
        o.strategy = v.strategy;
        o.direct = v.direct;
        o.threads = 3;
        o.destination = dest->get();
        LoadStats st;
        auto got = load_back(files, o, &st);
        ASSERT_TRUE(got.ok()) << v.name << ": " << got.status().to_string();
        EXPECT_EQ(*got, *want) << v.name << " one_allocation=" << one << " " << source;
        if (v.strategy == Strategy::kAuto) EXPECT_EQ(st.strategy, Strategy::kStream);
        EXPECT_GT((*dest)->allocated_bytes(), 0u);
      }
    }
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  EXPECT_EQ(stats().pageable_async_copies.load(), 0u);
  EXPECT_EQ(stats().device_live.load(), 0);  // every tensor's memory went with its views
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
}

TEST_F(FakeGpu, StreamShardedDeviceLoadsEqualShardedHostLoads) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  for (int rank = 0; rank < 2; ++rank) {
    LoadOptions host;
    host.strategy = Strategy::kLazy;
    host.tp_size = 2;
    host.tp_rank = rank;
    host.shard_rules = {*parse_shard_rule("*.big:0"), *parse_shard_rule("*.rows:1"), *parse_shard_rule("c.wide:1")};
    auto want = load_all(files, host);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    for (const Variant& v : kVariants)
      for (Toggle gds : {Toggle::kOff, Toggle::kOn}) {
        if (gds == Toggle::kOn && v.strategy != Strategy::kStream) continue;  // GDS serves the stream strategy
        auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = gds});
        ASSERT_TRUE(dest.ok());
        LoadOptions o = host;
        o.strategy = v.strategy;
        o.direct = v.direct;
        o.destination = dest->get();
        auto got = load_back(files, o);
        ASSERT_TRUE(got.ok()) << v.name << ": " << code_name(got.status().code()) << got.status().to_string();
        EXPECT_EQ(*got, *want) << v.name << " rank " << rank << " gds " << toggle_name(gds);
      }
  }
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
}

// LoadOptions::rows (safetensors' prefetch plans): only the rows asked for are
// read, copied and allocated, into a device as into the host; the shapes say so.
TEST_F(FakeGpu, StreamRowSelectionsReadOnlyThoseRows) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto whole = load_all(files, {});
  ASSERT_TRUE(whole.ok());
  LoadOptions host;
  host.strategy = Strategy::kLazy;
  host.rows = {{"a.big", {7, 107}}, {"b.rows", {0, 0}}, {"c.wide", {3, 8}}, {"c.last", {4, 5}}};
  auto want = load_all(files, host);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  EXPECT_EQ((*want)["a.big"], (*whole)["a.big"].substr(7 * 257 * 4, 100 * 257 * 4));
  EXPECT_EQ((*want)["b.rows"], "");
  EXPECT_EQ((*want)["c.wide"], (*whole)["c.wide"].substr(3 * 40000 * 4));
  EXPECT_EQ((*want)["c.last"], (*whole)["c.last"].substr(4 * 5 * 4));
  EXPECT_EQ((*want)["a.tiny"], (*whole)["a.tiny"]);  // not named: whole
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  ASSERT_TRUE(dest.ok());
  LoadOptions o = host;
  o.strategy = Strategy::kStream;
  o.destination = dest->get();
  std::map<std::string, std::pair<Shape, Shape>> shapes;  // delivered, in the file
  auto got = load_files(files, o, [&](LoadedTensor&& t) {
    shapes[t.name] = {t.view.shape(), t.full_shape};
    return Status();
  });
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(shapes["a.big"].first, (Shape{100, 257}));
  EXPECT_EQ(shapes["a.big"].second, (Shape{300, 257}));
  EXPECT_EQ(shapes["c.wide"].first, (Shape{5, 40000}));
  EXPECT_EQ(shapes["b.rows"].first, (Shape{0, 96}));
  // Only the planned bytes went to the device: the selected rows and the tensors not named
  // (each rounded up to the arena's 256-byte alignment).
  uint64_t planned = 0;
  for (auto& [name, bytes] : *want) planned += bytes.size();
  EXPECT_GE((*dest)->allocated_bytes(), planned);
  EXPECT_LT((*dest)->allocated_bytes(), planned + 256 * want->size());
  auto back = load_back(files, o);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *want);
  dest->reset();  // the destination holds its last arena
  EXPECT_EQ(stats().device_live.load(), 0);
}

TEST_F(FakeGpu, StreamRowSelectionsOutsideTheTensorFailBeforeReading) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  struct Case {
    std::map<std::string, RowRange, std::less<>> rows;
    std::vector<std::string> rules;
    const char* says;
  } cases[] = {
      {{{"a.big", {290, 301}}}, {}, "slice [290, 301) is outside dim 0 of shape [300, 257]"},
      {{{"a.big", {5, 2}}}, {}, "outside dim 0"},
      {{{"b.rows", {0, 4}}}, {"*.rows:1"}, "a row selection and the shard rule '*.rows:1' both apply"},
  };
  for (const Case& c : cases) {
    LoadOptions o;
    o.strategy = Strategy::kStream;
    o.rows = c.rows;
    for (auto& r : c.rules) o.shard_rules.push_back(*parse_shard_rule(r));
    if (!c.rules.empty()) o.tp_size = 2;
    uint64_t handed = 0;
    auto r = load_files(files, o, [&](LoadedTensor&&) { return ++handed, Status(); });
    ASSERT_FALSE(r.ok()) << c.says;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().to_string().find(c.says), std::string::npos) << r.status().to_string();
    EXPECT_EQ(handed, 0u);
  }
}

// The device memory of a load is freed by cudaFree when its last view goes,
// and cudaFree waits for the work queued on it: a tensor read on another
// stream (safetensors' prefetch hands tensors out to the consumer's current
// stream) may be dropped while that read is still queued.
TEST_F(FakeGpu, StreamFreeOfTheLastViewWaitsForCopiesQueuedOnIt) {
  install({.copy_delay = std::chrono::milliseconds(30)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  ASSERT_TRUE(want.ok());
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  ASSERT_TRUE(dest.ok());
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.destination = dest->get();
  std::optional<TensorView> big;
  auto r = load_files(files, o, [&](LoadedTensor&& t) {
    if (t.name == "a.big") big = std::move(t.view);
    return Status();
  });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  dest->reset();  // the view alone holds the load's device memory now
  ASSERT_TRUE(big && big->nbytes() == (*want)["a.big"].size());
  const auto& rt = gpu::backend().api().rt;
  void* consumer = nullptr;
  ASSERT_EQ(rt.streamCreateWithFlags(&consumer, kCudaStreamNonBlocking), 0);
  std::string host(big->nbytes(), '\0');
  ASSERT_EQ(rt.memcpyAsync(host.data(), big->data(), big->nbytes(), kCudaMemcpyDeviceToHost, consumer), 0);
  big.reset();  // cudaFree, the copy still queued behind the delay
  EXPECT_EQ(stats().device_live.load(), 0);
  EXPECT_TRUE(host == (*want)["a.big"]);  // it ran before the free returned: no synchronize was needed
  EXPECT_EQ(rt.streamDestroy(consumer), 0);
}

TEST_F(FakeGpu, StreamPinnedAndCallerDestinations) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  ASSERT_TRUE(want.ok());
  // Pinned: host-accessible, one allocation for the load.
  auto pinned = gpu::pinned_destination();
  ASSERT_TRUE(pinned.ok());
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.destination = pinned->get();
  auto got = load_all(files, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  EXPECT_EQ(stats().pinned_allocs.load(), 1u);  // the load's one allocation (no ring: the engine reads into it)
  // The caller's own device memory (vLLM's parameters), with our uploader.
  auto up = gpu::make_uploader({DeviceKind::kCuda, 0});
  ASSERT_TRUE(up.ok());
  std::mutex mu;
  std::map<std::string, gpu::DeviceBuffer> params;
  auto dest = caller_destination(
      [&](const TensorRequest& r) -> Result<Region> {
        WL_ASSIGN_OR_RETURN(auto b, gpu::DeviceBuffer::allocate(r.nbytes));
        std::lock_guard lk(mu);
        auto& p = params[r.name] = std::move(b);
        return Region{static_cast<std::byte*>(p.data()), r.nbytes, {DeviceKind::kCuda, 0}, nullptr};
      },
      {DeviceKind::kCuda, 0}, up->get());
  for (Strategy s : {Strategy::kLazy, Strategy::kStream}) {
    params.clear();
    LoadOptions c;
    c.strategy = s;
    c.destination = dest.get();
    std::set<std::string> names;
    ASSERT_TRUE(load_files(files, c, [&](LoadedTensor&& t) {
                  EXPECT_EQ(t.view.owner(), nullptr);  // the caller owns it
                  names.insert(t.name);
                  return Status();
                }).ok());
    EXPECT_EQ(names.size(), want->size());
    for (auto& [name, bytes] : *want) {
      std::string back(bytes.size(), '\0');
      ASSERT_TRUE(params[name].copy_to_host(std::as_writable_bytes(std::span(back.data(), back.size()))).ok());
      EXPECT_EQ(back, bytes) << name;
    }
  }
}

TEST_F(FakeGpu, StreamOrderedDeliversInCheckpointOrder) {
  install({.copy_delay = std::chrono::microseconds(100)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  ASSERT_TRUE(dest.ok());
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.threads = 4;
  o.ordered = true;
  o.destination = dest->get();
  std::vector<uint64_t> order;
  ASSERT_TRUE(load_back(files, o, nullptr, &order).ok());
  ASSERT_EQ(order.size(), 8u);
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i);
}

TEST_F(FakeGpu, StreamCancelMidLoadReturnsEverySlot) {
  install({.copy_delay = std::chrono::microseconds(500)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  for (Strategy s : {Strategy::kStream, Strategy::kLazy, Strategy::kEager}) {
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    ASSERT_TRUE(dest.ok());
    LoadOptions o;
    o.strategy = s;
    o.threads = 4;
    o.destination = dest->get();
    int calls = 0;
    o.progress = [&](const LoadProgress&) { return ++calls < 3; };
    int delivered = 0;
    auto r = load_files(files, o, [&](LoadedTensor&&) {
      ++delivered;
      return Status();
    });
    EXPECT_EQ(r.status().code(), Code::kCancelled) << strategy_name(s);
    EXPECT_EQ(delivered, 3);
    EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u) << strategy_name(s);
  }
}

TEST_F(FakeGpu, StreamCopyErrorFailsTheLoadAndTheNextLoadWorks) {
  install({.fail_copy_at = 5});
  TempDir dir;
  auto files = make_checkpoint(dir);
  for (Strategy s : {Strategy::kStream, Strategy::kLazy}) {
    install({.fail_copy_at = 5});
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    ASSERT_TRUE(dest.ok());
    LoadOptions o;
    o.strategy = s;
    o.destination = dest->get();
    auto r = load_back(files, o);
    EXPECT_EQ(r.status().code(), Code::kIoError) << strategy_name(s);
    EXPECT_NE(r.status().to_string().find("CUDA: copy to cuda:0: an illegal memory access"), std::string::npos)
        << r.status().to_string();
    auto again = load_back(files, o);  // the fault was one copy
    EXPECT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
  }
}

TEST_F(FakeGpu, OutOfDeviceMemoryNamesTheSize) {
  install({.memory_per_device = 1 << 20});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0});
  ASSERT_TRUE(dest.ok());
  LoadOptions o;
  o.destination = dest->get();
  auto r = load_back(files, o);
  EXPECT_EQ(r.status().code(), Code::kIoError);
  EXPECT_NE(r.status().message().find("cudaMalloc of"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("out of memory"), std::string::npos);
}

// ---- GPUDirect Storage --------------------------------------------------------------------

TEST_F(FakeGpu, StreamGdsReadsStraightIntoDeviceMemory) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOn});
  ASSERT_TRUE(dest.ok());
  LoadOptions o;
  o.destination = dest->get();
  LoadStats st;
  auto got = load_back(files, o, &st);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  EXPECT_TRUE(st.gds);
  EXPECT_EQ((*dest)->gds_status(), "on");
  EXPECT_GT(stats().cufile_reads.load(), 0u);
  EXPECT_EQ(stats().async_copies.load(), 0u);    // nothing went through the ring
  EXPECT_EQ(stats().cufile_buffers.load(), 1u);  // the load's one allocation, registered
}

TEST_F(FakeGpu, StreamGdsRefusedBeforeTheFirstTensorFallsBackToTheRing) {
  for (bool driver_fails : {false, true}) {
    install({.cufile_driver_fails = driver_fails, .cufile_register_fails = !driver_fails});
    TempDir dir;
    auto files = make_checkpoint(dir);
    auto want = load_all(files, {});
    // auto: the ring instead, same bytes, the reason logged.
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kAuto});
    ASSERT_TRUE(dest.ok());
    LoadOptions o;
    o.destination = dest->get();
    std::vector<std::string> log;
    o.log = [&](const std::string& l) { log.push_back(l); };
    LoadStats st;
    auto got = load_back(files, o, &st);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *want);
    EXPECT_FALSE(st.gds);
    EXPECT_GT(stats().async_copies.load(), 0u);
    EXPECT_EQ(stats().cufile_reads.load(), 0u);
    EXPECT_NE((*dest)->gds_status().find(driver_fails ? "cuFileDriverOpen failed" : "does not support GPUDirect"),
              std::string::npos)
        << (*dest)->gds_status();
    bool logged = false;
    for (auto& l : log) logged |= l.find("GPUDirect Storage off") != std::string::npos;
    EXPECT_TRUE(logged);
    // on: the load fails before any tensor is handed over.
    auto strict = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOn});
    o.destination = strict->get();
    int delivered = 0;
    auto r = load_files(files, o, [&](LoadedTensor&&) {
      ++delivered;
      return Status();
    });
    EXPECT_EQ(r.status().code(), Code::kUnimplemented);
    EXPECT_NE(r.status().message().find("gds=on: GPUDirect Storage cannot be used"), std::string::npos)
        << r.status().to_string();
    EXPECT_EQ(r.status().file(), files[0]);
    EXPECT_EQ(delivered, 0);
  }
}

TEST_F(FakeGpu, StreamGdsErrorAfterTheFirstTensorPropagates) {
  install({.cufile_fail_read_at = 3});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0});
  ASSERT_TRUE(dest.ok());
  LoadOptions o;
  o.destination = dest->get();
  o.threads = 1;
  o.block_size = 16 << 10;
  int delivered = 0;
  auto r = load_files(files, o, [&](LoadedTensor&&) {
    ++delivered;
    return Status();
  });
  EXPECT_EQ(r.status().code(), Code::kIoError);
  EXPECT_NE(r.status().message().find("cuFileRead of"), std::string::npos)
      << code_name(r.status().code()) << r.status().to_string();
  EXPECT_NE(r.status().message().find("(cuFile error 5011)"), std::string::npos) << r.status().to_string();
  EXPECT_GE(delivered, 1);                     // tensors were handed over before the failure...
  EXPECT_EQ(stats().async_copies.load(), 0u);  // ...so there was no fallback
}

TEST_F(FakeGpu, StreamGdsNeedsALocalFile) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  testing::CountingEnv env;  // wraps every file: no descriptor to hand to cuFile
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0});
  LoadOptions o;
  o.env = &env;
  o.destination = dest->get();
  LoadStats st;
  ASSERT_TRUE(load_back(files, o, &st).ok());
  EXPECT_FALSE(st.gds);
  EXPECT_NE((*dest)->gds_status().find("not a local file"), std::string::npos) << (*dest)->gds_status();
}

// ---- every strategy rides the ring ---------------------------------------------------------

TEST_F(FakeGpu, StreamPerFileStrategiesToADeviceTakeTheStreamAndSaySo) {
  install({.copy_delay = std::chrono::microseconds(50)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  ASSERT_TRUE(want.ok());
  for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kThreads, Strategy::kPrefetch}) {
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    ASSERT_TRUE(dest.ok());
    LoadOptions o;
    o.strategy = s;
    o.threads = 4;
    o.destination = dest->get();
    std::vector<std::string> log;
    o.log = [&](const std::string& l) { log.push_back(l); };
    LoadStats st;
    std::vector<uint64_t> order;
    auto got = load_back(files, o, &st, &order);
    ASSERT_TRUE(got.ok()) << strategy_name(s) << ": " << got.status().to_string();
    EXPECT_EQ(*got, *want) << strategy_name(s);
    EXPECT_EQ(st.strategy, Strategy::kStream) << strategy_name(s);
    bool said = false;
    for (auto& l : log) said |= l.find(std::string(strategy_name(s)) + ": the stream strategy instead") == 0;
    EXPECT_TRUE(said) << strategy_name(s);
    if (s != Strategy::kThreads)  // lazy, eager and prefetch keep their file order
      for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i) << strategy_name(s);
  }
  // WEIGHTLIFT_DEVICE_STRATEGY=asked: the strategy as asked (for A/B runs).
  ScopedEnv asked("WEIGHTLIFT_DEVICE_STRATEGY", "asked");
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  LoadOptions o;
  o.strategy = Strategy::kLazy;
  o.destination = dest->get();
  LoadStats st;
  auto got = load_back(files, o, &st);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *want);
  EXPECT_EQ(st.strategy, Strategy::kLazy);
}

// ---- copies straight out of the page cache (registered read-only) --------------------------

TEST_F(FakeGpu, StreamMappedCopiesComeFromThePageCacheAndEqualTheHost) {
  install({.copy_delay = std::chrono::microseconds(20)});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  ASSERT_TRUE(want.ok());
  ScopedEnv mapped("WEIGHTLIFT_H2D_SOURCE", "mapped");
  for (bool shards : {false, true}) {
    LoadOptions host;
    if (shards) {
      host.tp_size = 2, host.tp_rank = 1;
      host.shard_rules = {*parse_shard_rule("*.big:0"), *parse_shard_rule("*.rows:1"), *parse_shard_rule("c.wide:1")};
    }
    auto expect = load_all(files, host);
    ASSERT_TRUE(expect.ok());
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    LoadOptions o = host;
    o.strategy = Strategy::kStream;
    o.threads = 3;
    o.block_size = 64 << 10;
    o.destination = dest->get();
    std::vector<std::string> log;
    o.log = [&](const std::string& l) { log.push_back(l); };
    LoadStats st;
    auto got = load_back(files, o, &st);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *expect) << "shards " << shards;
    EXPECT_TRUE(st.host_registered);
    bool said = false;
    for (auto& l : log) said |= l.find("copies straight out of the page cache") != std::string::npos;
    EXPECT_TRUE(said);
  }
  EXPECT_GT(stats().registered_async_copies.load(), 0u);
  EXPECT_EQ(stats().pageable_async_copies.load(), 0u);  // never an unregistered host source
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  EXPECT_EQ(stats().host_registers.load(), stats().host_unregisters.load());  // every segment undone
  EXPECT_EQ(stats().host_registered_live.load(), 0);
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 4u);
}

TEST_F(FakeGpu, StreamMappedRefusedFallsBackToTheRing) {
  for (bool attribute : {true, false}) {
    install({.host_register = !attribute ? false : true, .host_register_fails = attribute});
    TempDir dir;
    auto files = make_checkpoint(dir);
    auto want = load_all(files, {});
    ScopedEnv mapped("WEIGHTLIFT_H2D_SOURCE", "mapped");
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    LoadOptions o;
    o.strategy = Strategy::kStream;
    o.destination = dest->get();
    std::vector<std::string> log;
    o.log = [&](const std::string& l) { log.push_back(l); };
    auto got = load_back(files, o);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *want);
    EXPECT_EQ(stats().registered_async_copies.load(), 0u);
    EXPECT_GT(stats().async_copies.load(), 0u);  // through the slots
    bool said = false;
    for (auto& l : log)
      said |= l.find(attribute ? "registering the page cache for DMA failed" : "cannot register host memory") !=
              std::string::npos;
    EXPECT_TRUE(said) << attribute;
  }
}

TEST_F(FakeGpu, StreamMappedAutoOnlyForAHotCheckpointOnFewCores) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  testing::CountingEnv env;
  for (double cached : {1.0, 0.2}) {
    env.cached = cached;
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
    LoadOptions o;
    o.env = &env;
    o.strategy = Strategy::kStream;
    o.direct = Toggle::kOff;
    o.destination = dest->get();
    LoadStats st;
    ASSERT_TRUE(load_back(files, o, &st).ok());
    const bool few_cores = std::thread::hardware_concurrency() < 8;
    EXPECT_EQ(st.host_registered, few_cores && cached == 1.0) << cached;
  }
  ScopedEnv bad("WEIGHTLIFT_H2D_SOURCE", "sometimes");
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.direct = Toggle::kOff;
  o.destination = dest->get();
  auto r = load_back(files, o);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("WEIGHTLIFT_H2D_SOURCE='sometimes'"), std::string::npos);
}

// ---- GPUDirect Storage only where it can read GPU-direct -----------------------------------

TEST(GdsPlatform, MountinfoSysfsAndCufileJson) {
  const std::string mi =
      "22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
      "30 22 0:26 / /dev/shm rw shared:4 - tmpfs tmpfs rw\n"
      "41 22 252:1 / /data rw - xfs /dev/vda1 rw\n"
      "50 22 0:51 / /mnt/weka rw - wekafs default rw\n";
  EXPECT_EQ(gpu::fs_type_in_mountinfo(mi, makedev(259, 2)), "ext4");
  EXPECT_EQ(gpu::fs_type_in_mountinfo(mi, makedev(0, 26)), "tmpfs");
  EXPECT_EQ(gpu::fs_type_in_mountinfo(mi, makedev(252, 1)), "xfs");
  EXPECT_EQ(gpu::fs_type_in_mountinfo(mi, makedev(0, 51)), "wekafs");
  EXPECT_EQ(gpu::fs_type_in_mountinfo(mi, makedev(8, 1)), "");
  EXPECT_EQ(gpu::disk_kind_of_sysfs_path("/sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p2"), "nvme");
  EXPECT_EQ(gpu::disk_kind_of_sysfs_path("/sys/devices/pci0000:00/0000:00:05.0/virtio2/block/vda/vda1"), "virtio");
  EXPECT_EQ(
      gpu::disk_kind_of_sysfs_path("/sys/devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda"),
      "scsi");
  EXPECT_EQ(gpu::disk_kind_of_sysfs_path("/sys/devices/virtual/block/md0"), "md");
  EXPECT_EQ(gpu::disk_kind_of_sysfs_path("/sys/devices/virtual/block/dm-3"), "dm");
  EXPECT_EQ(gpu::disk_kind_of_sysfs_path("/sys/devices/virtual/block/loop7"), "loop");
  EXPECT_TRUE(gpu::cufile_json_enables_p2pdma(
      "{\n // \"use_pci_p2pdma\": false,\n \"properties\": { \"use_pci_p2pdma\" : true, \"url\": \"http://x\" }\n}"));
  EXPECT_FALSE(gpu::cufile_json_enables_p2pdma("{\n // \"use_pci_p2pdma\": true,\n \"properties\": {}\n}"));
  EXPECT_FALSE(gpu::cufile_json_enables_p2pdma("{\"properties\": {\"use_pci_p2pdma\": false}}"));
  EXPECT_FALSE(gpu::cufile_json_enables_p2pdma(""));
  // This machine's own facts: a temporary file's filesystem is found.
  TempDir dir;
  write_st(dir.file("x.safetensors"), {{"x", make_f32({4}, 1)}});
  auto f = Env::Default()->open(dir.file("x.safetensors"), {.mode = FileMode::kPread});
  ASSERT_TRUE(f.ok());
  gpu::GdsPlatform p = gpu::probe_platform(io::posix_fd(**f, false));
  EXPECT_NE(p.fs_type, "") << "mountinfo has no line for the temporary directory's filesystem";
  EXPECT_NE(p.fs_id, 0u);
}

TEST(GdsPlatform, RulesBeforeAndAfterOpeningCufile) {
  using P = gpu::GdsPlatform;
  struct Row {
    P p;
    const char* refusal;  // "" = may read GPU-direct
  };
  const Row rows[] = {
      {{1, "ext4", "nvme", true, false}, ""},
      {{1, "xfs", "nvme", false, true}, ""},  // P2PDMA mode: no nvidia-fs needed on NVMe
      {{1, "ext4", "virtio", true, false}, "GPUDirect Storage reads ext4 only from NVMe disks, and this one is virtio"},
      {{1, "ext4", "md over scsi", true, false}, "this one is md over scsi"},
      {{1, "ext4", "nvme", false, false}, "the nvidia-fs kernel driver is not loaded"},
      {{1, "nfs4", "", true, false}, ""},
      {{1, "lustre", "", false, true}, "the nvidia-fs kernel driver is not loaded"},  // P2PDMA serves NVMe only
      {{1, "tmpfs", "", true, false}, "GPUDirect Storage does not read from tmpfs"},
      {{1, "overlay", "", true, false}, "GPUDirect Storage does not read from overlay"},
      {{1, "", "", true, false}, "the file's filesystem could not be identified"},
  };
  for (const Row& r : rows) {
    std::string why = gpu::platform_refusal(r.p);
    if (*r.refusal == 0)
      EXPECT_EQ(why, "") << r.p.fs_type << " " << r.p.disk;
    else
      EXPECT_NE(why.find(r.refusal), std::string::npos) << why;
  }
  WlCuFileDrvProps props{};
  const P nvme{1, "ext4", "nvme", true, false}, nfs{1, "nfs", "", true, false};
  EXPECT_NE(gpu::properties_refusal(props, nvme).find("compatibility mode only"), std::string::npos);
  props.nvfs.major_version = 2;
  EXPECT_NE(gpu::properties_refusal(props, nvme).find("cuFile does not read ext4 GPU-direct"), std::string::npos);
  props.nvfs.dstatusflags = 1u << kCuFileNvmeSupported;
  EXPECT_EQ(gpu::properties_refusal(props, nvme), "");
  EXPECT_NE(gpu::properties_refusal(props, nfs).find("cuFile does not read nfs"), std::string::npos);
  props = {};
  props.nvfs.dstatusflags = 1u << kCuFileNvmeP2pSupported;  // no nvidia-fs, P2PDMA
  EXPECT_EQ(gpu::properties_refusal(props, nvme), "");
}

TEST_F(FakeGpu, StreamGdsAutoWhereThePlatformCannotNeverOpensCufile) {
  gpu::GdsPlatform virtio{0, "ext4", "virtio", false, false};
  install({.platform = virtio});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  for (int round = 0; round < 2; ++round) {
    auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kAuto});
    LoadOptions o;
    o.destination = dest->get();
    std::vector<std::string> log;
    o.log = [&](const std::string& l) { log.push_back(l); };
    LoadStats st;
    auto got = load_back(files, o, &st);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *want);
    EXPECT_FALSE(st.gds);
    EXPECT_NE((*dest)->gds_status().find("reads ext4 only from NVMe disks, and this one is virtio (cuFile not opened)"),
              std::string::npos)
        << (*dest)->gds_status();
  }
  EXPECT_EQ(stats().cufile_opens.load(), 0u);     // the fixed cost of cuFileDriverOpen never paid
  EXPECT_EQ(stats().platform_probes.load(), 1u);  // decided once for the filesystem
  EXPECT_GT(gpu::process_costs().gds_probe_ms, 0.0);
  // gds=on asks cuFile alone (the fake's accepts the file): the caller insists.
  auto on = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOn});
  LoadOptions o;
  o.destination = on->get();
  LoadStats st;
  ASSERT_TRUE(load_back(files, o, &st).ok());
  EXPECT_TRUE(st.gds);
  // WEIGHTLIFT_GDS_AUTO=cufile: auto trusts cuFile as before the platform checks (A/B runs).
  ScopedEnv trust("WEIGHTLIFT_GDS_AUTO", "cufile");
  auto aut = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kAuto});
  o.destination = aut->get();
  ASSERT_TRUE(load_back(files, o, &st).ok());
  EXPECT_TRUE(st.gds);
}

TEST_F(FakeGpu, StreamGdsAutoRefusesCufilesCompatibilityMode) {
  install({.cufile_compat_only = true});
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kAuto});
  LoadOptions o;
  o.destination = dest->get();
  LoadStats st;
  auto got = load_back(files, o, &st);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, *want);
  EXPECT_FALSE(st.gds);
  EXPECT_NE((*dest)->gds_status().find("compatibility mode only"), std::string::npos) << (*dest)->gds_status();
  EXPECT_EQ(stats().cufile_opens.load(), 1u);
  EXPECT_EQ(stats().cufile_reads.load(), 0u);
  // The default fake platform and driver read GPU-direct: auto keeps choosing GDS there.
  dest->reset();  // a destination never outlives the backend it was made on
  install({});
  auto again = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kAuto});
  o.destination = again->get();
  ASSERT_TRUE(load_back(files, o, &st).ok());
  EXPECT_TRUE(st.gds);
  EXPECT_GT(stats().cufile_reads.load(), 0u);
}

// ---- what a process pays once --------------------------------------------------------------

TEST_F(FakeGpu, WarmUpMakesTheRingAndCopierAheadOfTheFirstLoad) {
  gpu::fake::install({});  // no ring options set: the machine's ring
  EXPECT_FALSE(gpu::backend().ring_created());
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0});  // takes no ring yet
  ASSERT_TRUE(dest.ok());
  EXPECT_FALSE(gpu::backend().ring_created());
  gpu::warm_up({DeviceKind::kCuda, 0});
  gpu::wait_warm_up();
  EXPECT_TRUE(gpu::backend().ring_created());
  gpu::ProcessCosts c = gpu::process_costs();
  EXPECT_TRUE(c.warm_up);
  EXPECT_GT(c.ring_ms, 0.0);
  EXPECT_GT(c.copier_ms, 0.0);
  auto o = gpu::ring_options();
  EXPECT_EQ(c.ring_bytes, uint64_t{o->slots} * o->slot_bytes);
  EXPECT_NE(c.to_string().find("ring "), std::string::npos) << c.to_string();
  TempDir dir;
  auto files = make_checkpoint(dir);
  LoadOptions lo;
  lo.destination = dest->get();
  ASSERT_TRUE(load_back(files, lo).ok());
  EXPECT_GT(gpu::process_costs().first_allocation_ms, 0.0);
  // WEIGHTLIFT_GPU_WARMUP=0: nothing starts.
  dest->reset();  // a destination never outlives the backend it was made on
  gpu::fake::install({});
  ScopedEnv off("WEIGHTLIFT_GPU_WARMUP", "0");
  gpu::warm_up({DeviceKind::kCuda, 0});
  gpu::wait_warm_up();
  EXPECT_FALSE(gpu::backend().ring_created());
}

TEST_F(FakeGpu, StreamRingGrowsWhileALoadRuns) {
  // 20 slots: the first 8 now, 8 + 4 more on the ring's own thread while the
  // load already runs on the first ones (each cudaHostAlloc takes 100 ms here).
  gpu::fake::install({.copy_delay = std::chrono::microseconds(30), .host_alloc_delay = std::chrono::milliseconds(100)});
  ASSERT_TRUE(gpu::set_ring_options({20, kSlot, 2}).ok());
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  gpu::Ring* ring = *gpu::backend().ring();
  EXPECT_EQ(ring->slots(), 20u);
  EXPECT_EQ(ring->free_slots(), 8u);  // the rest is still being pinned
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.threads = 6;
  o.destination = dest->get();
  auto got = load_back(files, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  EXPECT_EQ(ring->wait_grown(), 20u);
  EXPECT_EQ(ring->free_slots(), 20u);
  EXPECT_EQ(stats().pinned_allocs.load(), 3u);  // blocks of 8, 8 and 4 slots
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  EXPECT_GT(gpu::process_costs().ring_grow_ms, 0.0);
  // A second, grown load uses slots from every block.
  got = load_back(files, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  EXPECT_EQ(stats().slot_overwrites.load(), 0u);
  // WEIGHTLIFT_RING_GROW=0: every block before the ring is handed out.
  ScopedEnv now("WEIGHTLIFT_RING_GROW", "0");
  dest->reset();  // a destination never outlives the backend it was made on
  gpu::fake::install({.host_alloc_delay = std::chrono::milliseconds(20)});
  ASSERT_TRUE(gpu::set_ring_options({20, kSlot, 2}).ok());
  EXPECT_EQ((*gpu::backend().ring())->free_slots(), 20u);
  EXPECT_EQ(stats().pinned_allocs.load(), 3u);
}

TEST_F(FakeGpu, StreamRingThatCannotGrowStillLoads) {
  // Pinned memory runs out after the first block: the ring stays at 8 slots
  // and loads still run (every slot returned, the bytes right).
  gpu::fake::install({.pinned_limit_bytes = 8 * kSlot});
  ASSERT_TRUE(gpu::set_ring_options({20, kSlot, 2}).ok());
  gpu::Ring* ring = *gpu::backend().ring();
  EXPECT_EQ(ring->wait_grown(), 8u);
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto want = load_all(files, {});
  auto dest = gpu::cuda_destination({DeviceKind::kCuda, 0}, {.gds = Toggle::kOff});
  LoadOptions o;
  o.strategy = Strategy::kStream;
  o.threads = 6;
  o.destination = dest->get();
  auto got = load_back(files, o);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, *want);
  EXPECT_EQ(ring->free_slots(), 8u);
}

TEST(GpuRing, MachineRingFollowsCoresAndMemory) {
  auto r = gpu::machine_ring_options(2, uint64_t{24} << 30);
  EXPECT_EQ(r.slots, 8u);
  EXPECT_EQ(r.slot_bytes, uint64_t{8} << 20);
  r = gpu::machine_ring_options(16, uint64_t{128} << 30);  // the H200 machine: 32 x 8 MiB
  EXPECT_EQ(r.slots, 32u);
  EXPECT_EQ(r.slot_bytes, uint64_t{8} << 20);
  r = gpu::machine_ring_options(64, uint64_t{1} << 40);
  EXPECT_EQ(r.slots, 64u);
  r = gpu::machine_ring_options(16, uint64_t{4} << 30);  // 64 MiB at most: 8 slots of 8 MiB
  EXPECT_EQ(r.slots * r.slot_bytes, uint64_t{64} << 20);
  r = gpu::machine_ring_options(16, uint64_t{1} << 30);  // 16 MiB at most: 8 slots of 2 MiB
  EXPECT_EQ(r.slots, 8u);
  EXPECT_EQ(r.slot_bytes, uint64_t{2} << 20);
}

// ---- odds and ends -----------------------------------------------------------------------------

TEST_F(FakeGpu, ReadToDeviceAndDummyFillMatchTheHost) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  auto f = Env::Default()->open(files[0], {.mode = FileMode::kPread});
  ASSERT_TRUE(f.ok());
  Tensor want = make_f32({300, 257}, 3);
  auto sf = SafetensorsFile::open(files[0], FileMode::kMmap);
  ASSERT_TRUE(sf.ok());
  const TensorInfo* info = (*sf)->find("a.big");
  ASSERT_NE(info, nullptr);
  for (Device d : {kCpu, Device{DeviceKind::kCudaHost, 0}, Device{DeviceKind::kCuda, 0}}) {
    auto v = gpu::read_to_device(**f, info->offset, DType::F32, {300, 257}, d);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->device(), d);
    std::vector<std::byte> back(v->nbytes());
    ASSERT_TRUE(gpu::copy_to_host(*v, back).ok());
    EXPECT_EQ(std::memcmp(back.data(), want.bytes().data(), back.size()), 0) << d.to_string();
  }
  // The dummy-weight kernel's fake runs the host fill: the same bytes.
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3, DType::F64}) {
    auto cpu = dummy_tensor(dt, {1001}, {-0.5, 0.25, 99, 1});
    ASSERT_TRUE(cpu.ok());
    auto buf = gpu::DeviceBuffer::allocate(cpu->nbytes());
    ASSERT_TRUE(gpu::fill_dummy_device(dt, *buf, 1001, {-0.5, 0.25, 99, 1}).ok());
    std::vector<std::byte> back(cpu->nbytes());
    ASSERT_TRUE(buf->copy_to_host(back).ok());
    EXPECT_EQ(std::memcmp(back.data(), cpu->bytes().data(), back.size()), 0) << dtype_name(dt);
  }
}

// ---- the CLI ------------------------------------------------------------------------------------

testing::CommandResult cli_with(const std::vector<std::string>& env, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(WEIGHTLIFT_CLI);
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_command(argv);
}

TEST(GpuCli, DeviceWithoutAGpuIsAClearError) {
  gpu::fake::uninstall();
  if (gpu::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  TempDir dir;
  auto files = make_checkpoint(dir);
  for (const char* d : {"cuda", "cuda:1", "pinned"}) {
    auto r = cli_with({"-u", "WEIGHTLIFT_GPU_BACKEND"}, {"load", files[0], "--device", d, "--no-progress"});
    EXPECT_EQ(r.exit_code, 1) << d << r.err;
    EXPECT_NE(r.err.find(gpu::unavailable_reason()), std::string::npos) << r.err;
  }
  auto bad = cli_with({}, {"load", files[0], "--device", "gpu0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("unknown device 'gpu0' (expected cpu, pinned, cuda or cuda:N)"), std::string::npos) << bad.err;
  auto fake_ordinal = cli_with({"WEIGHTLIFT_GPU_BACKEND=fake"}, {"load", files[0], "--device", "cuda:3"});
  EXPECT_EQ(fake_ordinal.exit_code, 1);
  EXPECT_NE(fake_ordinal.err.find("no CUDA device 3 (there are 1)"), std::string::npos) << fake_ordinal.err;
}

TEST(GpuCli, DeviceChecksumsEqualHostChecksums) {
  TempDir dir;
  auto files = make_checkpoint(dir);
  std::vector<std::string> base = {"load", dir.path(), "--checksum", "--no-progress"};
  auto host = testing::run_cli(base);
  ASSERT_EQ(host.exit_code, 0) << host.err;
  for (std::vector<std::string> extra :
       std::vector<std::vector<std::string>>{{"--device", "cuda", "--strategy", "stream"},
                                             {"--device", "cuda:0", "--strategy", "lazy"},
                                             {"--device", "cuda", "--strategy", "eager", "--gds", "off"},
                                             {"--device", "pinned"}}) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    auto dev = cli_with({"WEIGHTLIFT_GPU_BACKEND=fake", "WEIGHTLIFT_PINNED_RING=4x64KiB"}, args);
    ASSERT_EQ(dev.exit_code, 0) << dev.err;
    EXPECT_EQ(dev.out, host.out) << extra[1];
    EXPECT_NE(dev.err.find(extra[1] == "pinned" ? "pinned memory" : "device memory"), std::string::npos) << dev.err;
  }
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // shadow memory and quarantine inflate RSS
#else
constexpr bool kSanitized = false;
#endif

TEST(GpuCli, DeviceLoadHostMemoryIsBoundedByTheRing) {
  if (kSanitized) GTEST_SKIP() << "RSS under a sanitizer measures the sanitizer";
  // 96 MiB to the (fake) device through an 8 x 1 MiB ring: host RSS stays
  // near the ring, whereas the fake's device memory is host memory too and
  // is subtracted (the summary reports it).
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 12; ++i) ts.emplace_back("w" + std::to_string(i), make_f32({2048, 1024}, i));
  write_st(dir.file("big.safetensors"), ts);
  ts.clear();
  // Through the ring's slots: on a machine with < 8 cores a hot file is
  // otherwise copied out of its registered mapping, whose file pages count
  // in RSS while registered (page cache, not the load's own memory).
  auto r = cli_with({"WEIGHTLIFT_GPU_BACKEND=fake", "WEIGHTLIFT_PINNED_RING=8x1MiB", "WEIGHTLIFT_H2D_SOURCE=slot"},
                    {"load", dir.file("big.safetensors"), "--device", "cuda", "--strategy", "stream", "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(device memory ([0-9.]+) MiB, peak RSS ([0-9.]+) MiB)")))
      << r.err;
  double device = std::stod(m[1]), rss = std::stod(m[2]);
  EXPECT_NEAR(device, 96.0, 0.1);
  EXPECT_LT(rss - device, 8 + 64) << r.err;  // ring + 64 MiB (the process itself included)
}

}  // namespace
}  // namespace wl

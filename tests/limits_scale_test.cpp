// Resource limits: a checkpoint with a million tiny tensors, a 100 MB header,
// 10,000 files in a folder. Memory and work must grow in proportion to the
// input: the tests assert on operation counts (reads, opens, listings, open
// descriptors) and on peak memory measured against the input size, never on
// time. Peak memory is VmHWM of a fresh process after resetting it
// (clear_refs 5); under sanitizers, whose shadow memory distorts it, those
// checks are skipped.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <fstream>

#include <fmt/format.h>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/loader.h"
#include "weightlift/safetensors.h"
#include "weightlift/weight_files.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define WL_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define WL_SANITIZED 1
#endif
#endif
#ifndef WL_SANITIZED
#define WL_SANITIZED 0
#endif

namespace wl {
namespace {

using testing::FaultInjectionEnv;
using testing::StringFile;
using testing::TempDir;

// Peak memory is measured in a fresh process (this test binary, running the
// probe test below), so that memory freed by earlier tests cannot hide growth.
uint64_t current_rss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// Bytes of memory that opening a file of `tensors` tiny tensors takes (peak
// RSS above the RSS before the open), or nullopt where it cannot be measured.
std::optional<uint64_t> probe_peak_memory(size_t tensors) {
  ::setenv("WL_LIMITS_PROBE_TENSORS", std::to_string(tensors).c_str(), 1);
  auto r = testing::run_command({"/proc/self/exe", "--gtest_filter=LimitsScaleProbe.*"});
  ::unsetenv("WL_LIMITS_PROBE_TENSORS");
  auto pos = r.out.find("PEAK ");
  if (r.exit_code != 0 || pos == std::string::npos) return std::nullopt;
  return std::stoull(r.out.substr(pos + 5));
}

size_t open_fds() {
  size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n;
}

// A safetensors file of `n` one-byte U8 tensors "t0".."t{n-1}", built as text.
std::string many_tensor_file(size_t n) {
  std::string h = "{";
  h.reserve(n * 56 + 64);
  for (size_t i = 0; i < n; ++i) {
    if (i) h += ',';
    fmt::format_to(std::back_inserter(h), R"("t{}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})", i, i, i + 1);
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string file = testing::st_prefix(h);
  for (size_t i = 0; i < n; ++i) file.push_back(static_cast<char>(i * 7));
  return file;
}

// Sanitized Debug builds parse ~20x slower: they check the same code on fewer tensors.
constexpr size_t kMillion = WL_SANITIZED ? 100'000 : 1'000'000;

// Run only by probe_peak_memory() in a child process.
TEST(LimitsScaleProbe, PeakMemoryOfOpening) {
  const char* n = std::getenv("WL_LIMITS_PROBE_TENSORS");
  if (n == nullptr) GTEST_SKIP() << "a helper of the LimitsScale memory tests";
  const std::string bytes = many_tensor_file(std::stoul(n));
  auto file = std::make_shared<StringFile>("/mem/many.safetensors", bytes);
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak mark starts here
  const uint64_t before = current_rss();
  auto r = SafetensorsFile::open(file, FileMode::kMmap);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const uint64_t peak = peak_rss_bytes();
  std::printf("PEAK %llu\n", static_cast<unsigned long long>(peak > before ? peak - before : 0));
}

TEST(LimitsScale, AMillionTinyTensorsOpenWithTwoReads) {
  const std::string bytes = many_tensor_file(kMillion);
  auto file = std::make_shared<StringFile>("/mem/many.safetensors", bytes);
  auto sf = SafetensorsFile::open(file, FileMode::kMmap);
  ASSERT_TRUE(sf.ok()) << sf.status().to_string();
  EXPECT_EQ((*sf)->tensors().size(), kMillion);
  EXPECT_EQ(file->reads.load(), 2u);  // the length prefix, then the header: nothing per tensor
  const TensorInfo* last = (*sf)->find(fmt::format("t{}", kMillion - 1));
  ASSERT_NE(last, nullptr);
  auto t = (*sf)->read(last->name);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(static_cast<uint8_t>(t->bytes()[0]), static_cast<uint8_t>((kMillion - 1) * 7));
}

TEST(LimitsScale, MemoryGrowsLinearlyWithTheTensorCount) {
  if (WL_SANITIZED) GTEST_SKIP() << "peak RSS is not meaningful under sanitizers";
  const uint64_t header = many_tensor_file(kMillion).size() - kMillion - 8;
  auto small = probe_peak_memory(kMillion / 8), large = probe_peak_memory(kMillion);
  if (!small || !large || *small == 0) GTEST_SKIP() << "cannot measure the peak RSS here";
  std::printf("[   INFO   ] peak memory to open: %zu tensors %llu bytes, %zu tensors %llu bytes (header %llu bytes)\n",
              kMillion / 8, static_cast<unsigned long long>(*small), kMillion, static_cast<unsigned long long>(*large),
              static_cast<unsigned long long>(header));
  // 8x the tensors: between 4x and 12x the memory (linear with noise), not 64x.
  EXPECT_LT(*large, 12 * *small);
  EXPECT_GT(*large, 4 * *small);
  // The JSON DOM plus the tensor table: a fixed multiple of the header text.
  EXPECT_LT(*large, 30 * header);
}

TEST(LimitsScale, AHundredMegabyteHeaderIsReadOnceAndParsed) {
  // Exactly at the limit: one real tensor, then padding spaces to 100,000,000 bytes.
  std::string h = R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  h.append(kSafetensorsMaxHeader - h.size(), ' ');
  std::string bytes = testing::st_prefix(h) + std::string(8, '\x01');
  h.clear();
  h.shrink_to_fit();
  auto file = std::make_shared<StringFile>("/mem/big.safetensors", std::move(bytes));
  auto sf = SafetensorsFile::open(file, FileMode::kMmap);
  ASSERT_TRUE(sf.ok()) << sf.status().to_string();
  EXPECT_EQ((*sf)->header().header_size, kSafetensorsMaxHeader);
  EXPECT_EQ((*sf)->tensors().size(), 1u);
  EXPECT_EQ(file->reads.load(), 2u);
  EXPECT_EQ(file->bytes_read.load(), 8 + kSafetensorsMaxHeader);
}

TEST(LimitsScale, AHeaderLengthOverTheLimitIsRejectedBeforeAllocating) {
  // A "file" of 300 MB whose prefix claims a 200 MB header: rejected after
  // reading 8 bytes, so nothing was allocated for the header.
  std::string prefix = testing::st_prefix("");
  const uint64_t claimed = 200'000'000;
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((claimed >> (8 * i)) & 0xff);
  auto file = std::make_shared<StringFile>("/mem/huge.safetensors", prefix, 300'000'000);
  auto r = SafetensorsFile::open(file, FileMode::kMmap);
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_NE(r.status().message().find("exceeds the 100000000 byte limit"), std::string::npos);
  EXPECT_EQ(file->bytes_read.load(), 8u);
}

class LimitsTenThousandFiles : public ::testing::Test {
 protected:
  static constexpr size_t kFiles = 10'000;
  void SetUp() override {
    std::vector<NamedTensor> one;
    auto t = Tensor::empty(DType::U8, {4});
    ASSERT_TRUE(t.ok());
    one.push_back({"w", t->view()});
    auto bytes = serialize_safetensors(one);
    ASSERT_TRUE(bytes.ok());
    std::string index = R"({"metadata":{"total_size":40000},"weight_map":{)";
    for (size_t i = 0; i < kFiles; ++i) {
      std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, kFiles);
      testing::write_bytes(dir_.file(name), *bytes);
      fmt::format_to(std::back_inserter(index), "{}\"layer.{}.w\":\"{}\"", i ? "," : "", i, name);
    }
    index += "}}";
    testing::write_bytes(dir_.file("model.safetensors.index.json"), index);
    testing::write_bytes(dir_.file("model.safetensors"), *bytes);  // a consolidated copy, dropped by the index
  }
  TempDir dir_;
};

TEST_F(LimitsTenThousandFiles, FindingTheWeightsListsOnceAndChecksEachFileOnce) {
  FaultInjectionEnv env;
  auto wf = find_weight_files(dir_.path(), &env);
  ASSERT_TRUE(wf.ok()) << wf.status().to_string();
  ASSERT_EQ(wf->files.size(), kFiles);
  EXPECT_EQ(wf->files.front(), dir_.file("model-00001-of-10000.safetensors"));
  EXPECT_EQ(wf->files.back(), dir_.file("model-10000-of-10000.safetensors"));
  EXPECT_EQ(env.counters().lists.load(), 1u);
  EXPECT_EQ(env.counters().opens.load(), 1u);  // the index only
  EXPECT_LE(env.counters().exists.load(), kFiles + 2);
}

TEST_F(LimitsTenThousandFiles, LoadingThemAllKeepsFewDescriptorsOpen) {
  // Under the usual soft limit of 1024 descriptors, a loader that kept every
  // file open (and mapped) at once would fail with EMFILE.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 1024);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  auto files = find_weight_files(dir_.path());
  ASSERT_TRUE(files.ok());
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    FaultInjectionEnv env;
    LoadOptions o;
    o.strategy = s;
    o.env = &env;
    const size_t fds_before = open_fds();
    size_t max_fds = 0, n = 0;
    auto r = load_files(files->files, o, [&](LoadedTensor&&) {
      if (++n % 500 == 0) max_fds = std::max(max_fds, open_fds());
      return Status();
    });
    ASSERT_TRUE(r.ok()) << strategy_name(s) << ": " << r.status().to_string();
    EXPECT_EQ(r->tensors, kFiles);
    EXPECT_LE(max_fds, fds_before + 70) << strategy_name(s);
    EXPECT_LE(env.counters().opens.load(), 2 * kFiles) << strategy_name(s);
    EXPECT_LE(env.counters().reads.load(), 3 * kFiles) << strategy_name(s);
    EXPECT_LE(open_fds(), fds_before + 1) << "descriptors leaked by " << strategy_name(s);
  }
  ::setrlimit(RLIMIT_NOFILE, &old);
}

}  // namespace
}  // namespace wl

// The threading contracts of the read path, for ThreadSanitizer (scripts/test
// runs the tests matching *Concurren*:*Thread* under TSan): an opened
// SafetensorsFile, a RandomAccessFile and the default Env are used from many
// threads at once, with and without injected faults.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/checkpoint.h"
#include "weightlift/safetensors.h"

namespace wl {
namespace {

using testing::FaultInjectionEnv;
using testing::TempDir;

constexpr int kThreads = 8;
constexpr size_t kTensors = 16;

template <class F>
void run_threads(F&& body) {
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) ts.emplace_back([&, i] { body(i); });
  for (auto& t : ts) t.join();
}

TEST(FaultConcurrency, ManyThreadsReadOneFileInEveryMode) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(testing::write_test_model(path, kTensors, 3000).ok());
  FaultInjectionEnv no_mmap;  // views refused: the pread fallback path
  no_mmap.add({.path_suffix = ".safetensors"});
  struct Case {
    FileMode mode;
    Env* env;
  };
  for (Case c : {Case{FileMode::kMmap, Env::Default()}, Case{FileMode::kPread, Env::Default()},
                 Case{FileMode::kMmap, &no_mmap}}) {
    auto sf = SafetensorsFile::open(path, c.mode, c.env);
    ASSERT_TRUE(sf.ok()) << sf.status().to_string();
    std::atomic<int> bad{0};
    run_threads([&](int t) {
      for (int round = 0; round < 4; ++round) {
        for (size_t k = 0; k < kTensors; ++k) {
          size_t i = (k + static_cast<size_t>(t)) % kTensors;
          std::string name = fmt::format("t{}", i);
          auto v = (*sf)->get(name);
          auto r = (*sf)->read(name);
          auto rows = (*sf)->read_slice(name, 0, 10, 20);
          if (!v.ok() || !r.ok() || !rows.ok() || !testing::has_test_bytes(*v, i) ||
              !testing::has_test_bytes(r->view(), i) || rows->nbytes() != 10)
            bad++;
        }
      }
    });
    EXPECT_EQ(bad.load(), 0);
  }
}

TEST(FaultConcurrency, ThreadsOpeningTheSameFilesAgree) {
  TempDir dir;
  for (int f = 0; f < 4; ++f)
    ASSERT_TRUE(testing::write_test_model(dir.file(fmt::format("m{}.safetensors", f)), 4, 100).ok());
  std::atomic<int> bad{0};
  run_threads([&](int t) {
    for (int f = 0; f < 4; ++f) {
      auto ck = open_checkpoint(dir.file(fmt::format("m{}.safetensors", (f + t) % 4)));
      if (!ck.ok() || (*ck)->tensors().size() != 4) {
        bad++;
        continue;
      }
      for (size_t i = 0; i < 4; ++i) {
        auto v = (*ck)->view(i);
        if (!v.ok() || !testing::has_test_bytes(*v, i)) bad++;
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(FaultConcurrency, ThreadsSharingAFailingFileEachGetACleanError) {
  TempDir dir;
  std::string path = dir.file("m.safetensors");
  ASSERT_TRUE(testing::write_test_model(path, kTensors, 1000).ok());
  FaultInjectionEnv env;
  env.add({.path_suffix = "m.safetensors", .eio_after_reads = 40});
  auto sf = SafetensorsFile::open(path, FileMode::kMmap, &env);
  ASSERT_TRUE(sf.ok());
  std::atomic<int> ok{0}, failed{0}, wrong{0};
  run_threads([&](int t) {
    for (size_t k = 0; k < kTensors; ++k) {
      size_t i = (k + static_cast<size_t>(t)) % kTensors;
      auto r = (*sf)->read(fmt::format("t{}", i));
      if (r.ok()) {
        ok++;
        if (!testing::has_test_bytes(r->view(), i)) wrong++;
      } else {
        failed++;
        if (r.status().code() != Code::kIoError || r.status().file() != path || r.status().tensor().empty()) wrong++;
      }
    }
  });
  EXPECT_EQ(ok.load(), 38);  // 40 reads allowed, two of them were the header
  EXPECT_EQ(failed.load(), kThreads * static_cast<int>(kTensors) - 38);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace wl

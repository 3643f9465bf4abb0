// A shard replaced (rename of a complete new file) during a load: every
// strategy reads each file's header and data from the same version, so a
// load either delivers one consistent version of every file or fails with
// kAborted naming the file; never tensors that match neither version.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "engine_test_util.h"
#include "test_util.h"
#include "weightlift/loader.h"

namespace wl {
namespace {

using testing::make_f32;
using testing::TempDir;
using testing::write_st;

constexpr Strategy kAll[] = {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch, Strategy::kThreads,
                             Strategy::kStream};

// Two versions of one shard with the same names but different sizes and
// layouts, so a header of one version over the data of the other is visible.
void write_version(const std::string& path, int v) {
  if (v == 0)
    write_st(path, {{"a", make_f32({256}, 1)}, {"b", make_f32({64, 16}, 2)}, {"c", make_f32({8}, 3)}});
  else
    write_st(path, {{"a", make_f32({16}, 11)}, {"b", make_f32({64, 16}, 12)}, {"c", make_f32({512}, 13)}});
}

// Which version (0, 1) every tensor of a delivered file matches; -1 when mixed or neither.
int version_of(const std::map<std::string, std::string>& got) {
  for (int v : {0, 1}) {
    Tensor a = make_f32(v == 0 ? Shape{256} : Shape{16}, v == 0 ? 1 : 11);
    Tensor b = make_f32({64, 16}, v == 0 ? 2 : 12);
    Tensor c = make_f32(v == 0 ? Shape{8} : Shape{512}, v == 0 ? 3 : 13);
    auto same = [&](const char* n, const Tensor& t) {
      auto it = got.find(n);
      return it != got.end() && it->second == std::string(reinterpret_cast<const char*>(t.bytes().data()), t.nbytes());
    };
    if (same("a", a) && same("b", b) && same("c", c)) return v;
  }
  return -1;
}

// Replaces `path` with the other version on the n-th open of it (after the plan).
class ReplaceOnOpenEnv final : public EnvWrapper {
 public:
  ReplaceOnOpenEnv(std::string path, std::string other, int nth)
      : EnvWrapper(Env::Default()), path_(std::move(path)), other_(std::move(other)), nth_(nth) {}
  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    if (path == path_ && ++opens_ == nth_) {
      if (std::rename(other_.c_str(), path_.c_str()) != 0) return Status::Internal("test rename failed");
    }
    return EnvWrapper::open(path, o);
  }

 private:
  std::string path_, other_;
  int nth_;
  int opens_ = 0;
};

TEST(EngineVersions, ReplacedAfterPlanningIsAbortedNamingTheFile) {
  for (Strategy s : kAll) {
    TempDir dir;
    const std::string shard = dir.file("model.safetensors"), other = dir.file("next.safetensors");
    write_version(shard, 0);
    write_version(other, 1);
    ReplaceOnOpenEnv env(shard, other, /*nth=*/2);  // open 1 plans; the file changes before the data is read
    LoadOptions o;
    o.strategy = s;
    o.env = &env;
    o.direct = Toggle::kOff;
    auto r = testing::load_all({shard}, o);
    ASSERT_FALSE(r.ok()) << strategy_name(s) << " delivered tensors of a replaced file";
    EXPECT_EQ(r.status().code(), Code::kAborted) << strategy_name(s) << ": " << r.status().to_string();
    EXPECT_EQ(r.status().file(), shard) << strategy_name(s);
    EXPECT_NE(r.status().message().find("changed since the load was planned"), std::string::npos)
        << r.status().to_string();
  }
}

TEST(EngineVersions, ConcurrentReplacementNeverMixesVersions) {
  TempDir dir;
  const std::string shard = dir.file("model.safetensors");
  write_version(shard, 0);
  for (int v : {0, 1}) write_version(dir.file("v" + std::to_string(v)), v);
  std::atomic<bool> stop{false};
  std::thread replacer([&] {
    // Each round installs a complete copy of the next version by rename().
    for (int i = 0; !stop.load(); ++i) {
      std::string tmp = dir.file("tmp"), src = testing::read_bytes(dir.file("v" + std::to_string(i % 2)));
      testing::write_bytes(tmp, src);
      std::rename(tmp.c_str(), shard.c_str());
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  int ok = 0, aborted = 0;
  for (int round = 0; round < 12; ++round) {
    for (Strategy s : kAll) {
      LoadOptions o;
      o.strategy = s;
      o.threads = 2;
      o.direct = Toggle::kOff;
      auto r = testing::load_all({shard}, o);
      if (r.ok()) {
        EXPECT_NE(version_of(*r), -1) << strategy_name(s) << ": tensors match neither version";
        ++ok;
      } else {
        // A replacement between planning and reading; or one caught while the
        // header itself was being parsed (then the file looked truncated or grown).
        EXPECT_TRUE(r.status().code() == Code::kAborted || r.status().code() == Code::kCorruptData ||
                    r.status().code() == Code::kNotFound)
            << strategy_name(s) << ": " << r.status().to_string();
        ++aborted;
      }
    }
  }
  stop = true;
  replacer.join();
  EXPECT_GT(ok + aborted, 0);
}

}  // namespace
}  // namespace wl

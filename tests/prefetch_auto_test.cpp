// The auto policy over faked mount tables and meminfo; prefetch helpers.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "fake_system.h"
#include "test_util.h"
#include "weightlift/loader.h"
#include "weightlift/prefetch.h"

namespace wl {
namespace {

using testing::FakeSystemInfo;
using testing::TempDir;
using testing::write_bytes;

TEST(Prefetch, FilesystemTypeUsesLongestPrefix) {
  FakeSystemInfo sys;
  sys.mounts_text =
      "rootfs / ext4 rw 0 0\n"
      "srv:/export /data nfs4 rw 0 0\n"
      "/dev/sdb /data/local xfs rw 0 0\n"
      "lus /data/localx lustre rw 0 0\n"
      "x /with\\040space nfs rw 0 0\n"
      "garbage\n";
  EXPECT_EQ(filesystem_type("/data/model/a.safetensors", &sys), "nfs4");
  EXPECT_EQ(filesystem_type("/data", &sys), "nfs4");
  EXPECT_EQ(filesystem_type("/data/local/a.safetensors", &sys), "xfs");
  EXPECT_EQ(filesystem_type("/data/localx/a", &sys), "lustre");
  EXPECT_EQ(filesystem_type("/data/localy/a", &sys), "nfs4");  // a prefix must end at a '/'
  EXPECT_EQ(filesystem_type("/with space/f", &sys), "nfs");
  EXPECT_EQ(filesystem_type("/home/a", &sys), "ext4");
  FakeSystemInfo none;
  EXPECT_EQ(filesystem_type("/home/a", &none), "");
  EXPECT_TRUE(is_network_filesystem("nfs"));
  EXPECT_TRUE(is_network_filesystem("lustre"));
  EXPECT_FALSE(is_network_filesystem("ext4"));
}

TEST(Prefetch, AvailableRamFromMeminfo) {
  FakeSystemInfo sys;
  sys.meminfo_text = "MemTotal: 100 kB\nMemFree: 10 kB\nMemAvailable:    2048 kB\n";
  EXPECT_EQ(*available_ram_bytes(&sys), 2048u * 1024);
  sys.meminfo_text = "MemTotal: 100 kB\n";
  auto r = available_ram_bytes(&sys);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().to_string().find("no MemAvailable line"), std::string::npos);
  EXPECT_NE(r.status().to_string().find("/proc/meminfo"), std::string::npos);
  sys.meminfo_text = "MemAvailable: lots kB\n";
  EXPECT_EQ(available_ram_bytes(&sys).status().code(), Code::kCorruptData);
  sys.meminfo_text = "MemAvailable: 2048 MB\n";
  EXPECT_EQ(available_ram_bytes(&sys).status().code(), Code::kCorruptData);
  FakeSystemInfo none;
  EXPECT_EQ(available_ram_bytes(&none).status().code(), Code::kNotFound);
  // A cgroup limit lowers it; "max" means none.
  sys.meminfo_text = "MemAvailable:    2048 kB\n";
  sys.cgroup["memory.max"] = "1048576\n";
  sys.cgroup["memory.current"] = "524288\n";
  EXPECT_EQ(*available_ram_bytes(&sys), 524288u);
  sys.cgroup["memory.max"] = "max\n";
  EXPECT_EQ(*available_ram_bytes(&sys), 2048u * 1024);
}

TEST(SystemInfo, ProcessCounters) {
  FakeSystemInfo sys;
  sys.status_text = "Name: x\nVmPeak:  9 kB\nVmHWM:   1234 kB\nVmRSS: 12 kB\n";
  sys.io_text = "rchar: 100\nwchar: 7\nread_bytes: 4096\nwrite_bytes: 0\n";
  EXPECT_EQ(peak_rss_bytes(&sys), 1234u * 1024);
  EXPECT_EQ(storage_read_bytes(&sys), 4096u);
  FakeSystemInfo none;
  EXPECT_EQ(peak_rss_bytes(&none), 0u);
  EXPECT_EQ(storage_read_bytes(&none), 0u);
  EXPECT_GT(peak_rss_bytes(), 0u);  // the real /proc
}

struct AutoCase {
  const char* fstype;
  uint64_t avail_kb;
  bool prefetch;
  const char* reason;
};

TEST(Prefetch, AutoPolicy) {
  TempDir dir;
  std::string f = dir.file("w.safetensors");
  write_bytes(f, std::string(9000, 'x'));  // 9000 bytes; 90% of 10 kB is 9216
  const AutoCase cases[] = {
      {"nfs", 10, true, "network filesystem and it fits"},    {"nfs4", 10, true, "network filesystem and it fits"},
      {"lustre", 10, true, "network filesystem and it fits"}, {"nfs", 9, false, "exceeds 90% of RAM"},
      {"ext4", 1000000, false, "not a network filesystem"},
  };
  for (const AutoCase& c : cases) {
    FakeSystemInfo sys;
    sys.mounts_text = std::string("/dev/a / ext4 rw 0 0\nsrv:/x ") + dir.path() + " " + c.fstype + " rw 0 0\n";
    sys.meminfo_text = "MemAvailable: " + std::to_string(c.avail_kb) + " kB\n";
    auto facts = file_facts({f}, Env::Default(), &sys);
    auto path = choose(ReadRequest{.first_file = f}, *facts);
    ASSERT_TRUE(path.ok()) << path.status().to_string();
    ASSERT_TRUE(path->prefetch.has_value());
    const AutoDecision* d = &*path->prefetch;
    EXPECT_EQ(d->prefetch, c.prefetch) << c.fstype << " " << c.avail_kb;
    EXPECT_EQ(d->fstype, c.fstype);
    EXPECT_EQ(d->checkpoint_bytes, 9000u);
    EXPECT_NE(d->reason.find(c.reason), std::string::npos) << d->reason;
  }
}

TEST(Prefetch, AutoStrategyResolvesAndLogs) {
  TempDir dir;
  testing::write_st(dir.file("w.safetensors"), {{"a", testing::make_f32({4}, 1)}});
  FakeSystemInfo sys;
  sys.mounts_text = std::string("srv:/x ") + dir.path() + " nfs rw 0 0\n";
  sys.meminfo_text = "MemAvailable: 1000000 kB\n";
  LoadOptions o;
  o.strategy = Strategy::kAuto;
  o.system = &sys;
  std::vector<std::string> log;
  o.log = [&](const std::string& l) { log.push_back(l); };
  LoadStats st;
  ASSERT_TRUE(testing::load_all({dir.file("w.safetensors")}, o, &st).ok());
  EXPECT_EQ(st.strategy, Strategy::kPrefetch);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log[0].find("auto: prefetch"), std::string::npos) << log[0];
  sys.mounts_text = std::string("/dev/a ") + dir.path() + " ext4 rw 0 0\n";
  log.clear();
  ASSERT_TRUE(testing::load_all({dir.file("w.safetensors")}, o, &st).ok());
  EXPECT_EQ(st.strategy, Strategy::kLazy);
  EXPECT_NE(log[0].find("not a network filesystem"), std::string::npos) << log[0];
}

TEST(Prefetch, InvalidOptionsAreErrors) {
  PrefetchOptions o;
  o.threads = 0;
  auto s = prefetch_files({}, o);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("num threads must be >= 1 (got 0)"), std::string::npos);
  o.threads = 1;
  o.block_size = 0;
  s = prefetch_files({}, o);
  EXPECT_NE(s.message().find("block size"), std::string::npos);
  o.block_size = 16;
  o.rank = 2;
  o.world_size = 2;
  EXPECT_NE(prefetch_files({}, o).message().find("rank 2 is outside [0, 2)"), std::string::npos);
  EXPECT_FALSE(Prefetcher::start({}, o).ok());
}

TEST(Prefetch, StripesFilesByRankAndLogsEveryTenPercent) {
  TempDir dir;
  std::vector<std::string> files;
  for (int i = 0; i < 20; ++i) {
    files.push_back(dir.file("f" + std::to_string(i)));
    write_bytes(files.back(), std::string(1000 + i, 'a'));
  }
  testing::CountingEnv env;
  env.cached = 0.0;  // cold: every block is read in
  PrefetchOptions o;
  o.threads = 3;
  o.block_size = 256;
  o.rank = 1;
  o.world_size = 2;
  o.env = &env;
  std::vector<std::string> log;
  o.log = [&](const std::string& l) { log.push_back(l); };
  ASSERT_TRUE(prefetch_files(files, o).ok());
  auto opened = env.opened();
  EXPECT_EQ(opened.size(), 10u);
  for (auto& p : opened) {
    int idx = std::stoi(p.substr(p.rfind('f') + 1));
    EXPECT_EQ(idx % 2, 1) << p;
  }
  uint64_t bytes = 0;
  for (auto& r : env.reads()) {
    EXPECT_LE(r.len, 256u);
    bytes += r.len;
  }
  uint64_t want = 0;
  for (int i = 1; i < 20; i += 2) want += 1000 + i;
  EXPECT_EQ(bytes, want);
  ASSERT_EQ(log.size(), 10u);
  EXPECT_EQ(log[0], "Prefetching checkpoint files: 10% (1/10)");
  EXPECT_EQ(log[9], "Prefetching checkpoint files: 100% (10/10)");
  // A missing file is a warning, not an error.
  log.clear();
  o.rank = 0;
  o.world_size = 1;
  ASSERT_TRUE(prefetch_files({dir.file("missing")}, o).ok());
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("warning: failed to prefetch"), std::string::npos);
}

TEST(Prefetch, LeavesFilesAlreadyInThePageCacheAlone) {
  TempDir dir;
  std::vector<std::string> files = {dir.file("a"), dir.file("b")};
  for (auto& f : files) write_bytes(f, std::string(5000, 'a'));
  testing::CountingEnv env;
  env.cached = 0.95;
  PrefetchOptions o;
  o.block_size = 1024;
  o.env = &env;
  std::vector<std::string> log;
  o.log = [&](const std::string& l) { log.push_back(l); };
  ASSERT_TRUE(prefetch_files(files, o).ok());
  EXPECT_TRUE(env.reads().empty());  // nothing mapped in again
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back(), "Prefetching checkpoint files: 100% (2/2)");
  env.cached = 0.5;  // half cold: read in
  ASSERT_TRUE(prefetch_files(files, o).ok());
  uint64_t bytes = 0;
  for (auto& r : env.reads()) bytes += r.len;
  EXPECT_EQ(bytes, 10000u);
}

TEST(Prefetch, CheckpointSize) {
  TempDir dir;
  write_bytes(dir.file("a"), "12345");
  write_bytes(dir.file("b"), "123");
  EXPECT_EQ(*checkpoint_size_bytes({dir.file("a"), dir.file("b")}), 8u);
  EXPECT_EQ(checkpoint_size_bytes({dir.file("c")}).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace wl

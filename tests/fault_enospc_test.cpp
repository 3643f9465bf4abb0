// ENOSPC for real: the test mounts a small tmpfs (as root; skipped with a
// message otherwise) and writes conversions and files into it until it is
// full. Every write must fail with a clear error and leave no file, neither
// under the final name nor as a temporary.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/safetensors.h"
#include "weightlift/synth.h"

extern char** environ;

namespace wl {
namespace {

using testing::TempDir;

// A tmpfs of `options` mounted on a fresh directory for the test's lifetime.
class SmallFs {
 public:
  explicit SmallFs(const std::string& options) {
    if (::geteuid() != 0) {
      why_ = "not running as root";
      return;
    }
    if (::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      why_ = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallFs() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  std::string file(std::string_view name) const { return dir_.file(name); }
  const std::string& path() const { return dir_.path(); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string why_;
};

#define REQUIRE_SMALL_FS(fs) \
  if (!(fs).ok()) GTEST_SKIP() << "ENOSPC tests need a small tmpfs mount (" << (fs).why() << ")"

TEST(FaultEnospc, ConversionIntoAFullFilesystemFailsAndLeavesNothing) {
  SmallFs fs("size=256k");
  REQUIRE_SMALL_FS(fs);
  std::string out = fs.file("model.safetensors");
  Status s = testing::write_test_model(out, 4, 128 << 10);  // 512 KiB into 256 KiB
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.file(), out);
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.to_string();
  EXPECT_TRUE(testing::list_dir(fs.path()).empty());
  // Something that fits still works afterwards: the space was given back.
  ASSERT_TRUE(testing::write_test_model(out, 4, 16 << 10).ok());
  EXPECT_EQ(testing::list_dir(fs.path()), std::vector<std::string>{"model.safetensors"});
}

TEST(FaultEnospc, FailedReplacementKeepsTheOldFile) {
  SmallFs fs("size=256k");
  REQUIRE_SMALL_FS(fs);
  std::string out = fs.file("config.json");
  ASSERT_TRUE(write_file_atomic(out, "{\"old\":true}").ok());
  Status s = write_file_atomic(out, std::string(300 << 10, 'x'));
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.file(), out);
  EXPECT_EQ(testing::read_bytes(out), "{\"old\":true}");
  EXPECT_EQ(testing::list_dir(fs.path()), std::vector<std::string>{"config.json"});
}

TEST(FaultEnospc, NoInodeLeftForTheTemporaryIsAClearError) {
  SmallFs fs("size=1m,nr_inodes=2");  // the root directory takes one
  REQUIRE_SMALL_FS(fs);
  ASSERT_TRUE(write_file_atomic(fs.file("a"), "a").ok());
  Status s = write_file_atomic(fs.file("b"), "b");
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.file(), fs.file("b"));
  EXPECT_NE(s.message().find("cannot create temporary file"), std::string::npos) << s.to_string();
  EXPECT_EQ(testing::list_dir(fs.path()), std::vector<std::string>{"a"});
}

TEST(FaultEnospc, SynthIntoAFullFilesystemFailsWithoutPartialFiles) {
  SmallFs fs("size=1m");
  REQUIRE_SMALL_FS(fs);
  SynthOptions o;
  o.target_bytes = 4 << 20;
  auto r = synth_model(fs.path(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIoError);
  EXPECT_NE(r.status().message().find("No space left on device"), std::string::npos) << r.status().to_string();
  // Files that were completed before the disk filled are whole; no temporary
  // and no half-written shard remains.
  for (auto& name : testing::list_dir(fs.path())) {
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") {
      EXPECT_TRUE(SafetensorsFile::open(fs.file(name)).ok()) << name;
    }
  }
}

TEST(FaultEnospc, CliReportsTheFullDiskAndExitsOne) {
  SmallFs fs("size=1m");
  REQUIRE_SMALL_FS(fs);
  auto r = testing::run_cli({"synth", fs.file("m"), "--size", "4MB"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("weightlift: error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
}

// The loopback Hub server of the hub tests (tests/hubserver/hubserver.py).
class HubServer {
 public:
  explicit HubServer(const std::string& root) {
    port_file_ = root + ".ports";
    std::string script = std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/hubserver/hubserver.py";
    std::vector<std::string> args = {"python3",     script,     "--root",       root,
                                     "--port-file", port_file_, "--parent-pid", std::to_string(::getpid())};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    for (int i = 0; i < 400 && pid_ > 0; ++i) {  // bounded: 20 s
      std::ifstream in(port_file_);
      if (in >> port_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~HubServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    ::unlink(port_file_.c_str());
  }
  bool ok() const { return port_ > 0; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  pid_t pid_ = -1;
  std::string port_file_;
  int port_ = 0;
};

TEST(FaultEnospc, HubDownloadIntoAFullCacheLeavesNoBlobUnderItsFinalName) {
  SmallFs fs("size=1m");
  REQUIRE_SMALL_FS(fs);
  TempDir repos;
  std::string dir = repos.path() + "/org/big/main";
  std::filesystem::create_directories(dir);
  testing::write_bytes(dir + "/config.json", "{}");
  testing::write_bytes(dir + "/model.safetensors", std::string(3 << 20, 'w'));  // 3 MiB into 1 MiB
  HubServer server(repos.path());
  ASSERT_TRUE(server.ok()) << "the loopback Hub server did not start";
  HubOptions o;
  o.endpoint = server.endpoint();
  o.cache_dir = fs.path();
  o.token = "";
  o.offline = false;
  o.http.retry.max_attempts = 1;
  auto small = hf_hub_download("org/big", "config.json", "main", o);
  ASSERT_TRUE(small.ok()) << small.status().to_string();
  auto big = hf_hub_download("org/big", "model.safetensors", "main", o);
  ASSERT_FALSE(big.ok());
  // Refused before a byte is written: the blob's size is admitted against the free space first
  // (a disk that fills during the download is ENOSPC, hub_client_test's fault-injection cases).
  EXPECT_NE(big.status().to_string().find("more than the"), std::string::npos) << big.status().to_string();
  EXPECT_NE(big.status().to_string().find("free on the cache's disk"), std::string::npos) << big.status().to_string();
  // Blobs are whole or carry a partial suffix; no snapshot entry points to the big file.
  size_t blobs = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(fs.path())) {
    const std::string p = e.path().string();
    if (p.find("/blobs/") != std::string::npos && e.is_regular_file()) {
      const bool partial = p.ends_with(".incomplete") || p.ends_with(".incomplete.ranges");  // and its journal
      if (!partial) {
        ++blobs;
        EXPECT_EQ(testing::read_bytes(p), "{}") << p;  // only the small file is complete
      }
    }
    EXPECT_FALSE(p.ends_with("/model.safetensors")) << p;
    EXPECT_EQ(p.find(".tmp."), std::string::npos) << p;
  }
  EXPECT_EQ(blobs, 1u);
}

}  // namespace
}  // namespace wl

// ENOSPC for real: the test mounts a small tmpfs (as root; skipped with a
// message otherwise) and writes conversions and files into it until it is
// full. Every write must fail with a clear error and leave no file, neither
// under the final name nor as a temporary.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/io.h"
#include "weightlift/safetensors.h"
#include "weightlift/synth.h"

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

}  // namespace
}  // namespace wl

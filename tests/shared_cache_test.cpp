// A Hub cache shared between users cannot be turned against them: links
// planted in blobs/, snapshots/, refs/ and .locks/ are never written through,
// a neighbour's partial file is never adopted, new partial files and journals
// are created exclusively with the umask's mode (docs/integrity.md). The
// "neighbour" is simulated by this process planting files (and, as root,
// handing them to another uid); the download runs against the hostile
// server's Hub (tests/hostile/hostile_server.py). Release and ASan+UBSan.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "hostile_fixture.h"
#include "test_util.h"
#include "weightlift/hash.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/lock.h"

namespace wl {
namespace {

namespace fs = std::filesystem;
using namespace hostile;  // NOLINT: the shared fixture of these tests

constexpr uid_t kNeighbour = 65534;  // nobody: "another user" when the test runs as root

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

class SharedCache : public Hostile {
 protected:
  void SetUp() override {
    Hostile::SetUp();
    cache_ = tmp_.file("hub");
    storage_ = cache_ + "/models--org--m";
    outside_ = tmp_.file("outside");  // what a neighbour would like overwritten (~/.bashrc)
    write(outside_ + "/precious", "precious\n");
    ::chmod((outside_ + "/precious").c_str(), 0600);
    // The model's blob name: its LFS SHA-256 (the hostile Hub's X-Linked-Etag).
    HttpClient c(fast());
    HttpRequest r;
    r.url = server().main("/http/ok/model.safetensors");
    auto resp = c.request(r);
    ASSERT_TRUE(resp.ok());
    model_ = resp->body;
    sha_ = sha256_hex(std::string_view(model_));
  }
  Result<std::string> download() {
    SnapshotOptions s;
    s.allow_patterns = {"model.safetensors"};
    return snapshot_download("org/m", s, hub("ok", cache_));
  }
  void expect_outside_untouched() {
    EXPECT_EQ(slurp(outside_ + "/precious"), "precious\n");
    struct stat st {};
    ASSERT_EQ(::stat((outside_ + "/precious").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    size_t n = 0;
    for (auto it = fs::recursive_directory_iterator(outside_); it != fs::recursive_directory_iterator(); ++it) ++n;
    EXPECT_EQ(n, 1u) << "something was written outside the cache";
  }
  std::string cache_, storage_, outside_, model_, sha_;
};

TEST_F(SharedCache, PlantedPartialAndJournalLinksAreNeverWrittenThrough) {
  const std::string partial = storage_ + "/blobs/" + sha_ + ".deadbeef.incomplete";
  fs::create_directories(storage_ + "/blobs");
  fs::create_symlink(outside_ + "/precious", partial);
  fs::create_symlink(outside_ + "/precious", partial + ".ranges");
  const std::string lone = storage_ + "/blobs/" + sha_ + ".cafecafe.incomplete";  // a journal without its partial
  fs::create_symlink(outside_ + "/precious", lone + ".ranges");
  auto r = download();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(slurp(*r + "/model.safetensors"), model_);
  expect_outside_untouched();
  EXPECT_TRUE(fs::is_symlink(partial)) << "left alone";
  EXPECT_TRUE(fs::is_symlink(partial + ".ranges"));
  EXPECT_TRUE(fs::is_symlink(lone + ".ranges"));
}

TEST_F(SharedCache, APlantedBlobLinkIsReplacedNotFollowed) {
  fs::create_directories(storage_ + "/blobs");
  fs::create_symlink(outside_ + "/precious", storage_ + "/blobs/" + sha_);
  auto r = download();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(fs::is_symlink(storage_ + "/blobs/" + sha_));
  EXPECT_EQ(slurp(*r + "/model.safetensors"), model_);
  expect_outside_untouched();
}

TEST_F(SharedCache, PlantedFolderLinksAreRefusedAndNothingIsWrittenOutside) {
  for (const char* dir : {"blobs", "snapshots", "refs"}) {
    fs::remove_all(cache_);
    fs::create_directories(storage_);
    fs::create_directory_symlink(outside_, storage_ + "/" + dir);
    auto r = download();
    ASSERT_FALSE(r.ok()) << dir;
    EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
    EXPECT_TRUE(contains(r.status().to_string(), "is a symbolic link")) << r.status().to_string();
    EXPECT_TRUE(contains(r.status().to_string(), std::string("/") + dir)) << r.status().to_string();
    expect_outside_untouched();
  }
  // A snapshot folder of the commit planted as a link: the pointer is not made in it.
  fs::remove_all(cache_);
  auto first = download();  // learns the commit
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  const std::string snapshot = *first;
  fs::remove_all(snapshot);
  fs::create_directory_symlink(outside_, snapshot);
  auto again = download();
  ASSERT_FALSE(again.ok());
  expect_outside_untouched();
}

TEST_F(SharedCache, APlantedLockLinkIsRefusedAndItsTargetKeepsItsMode) {
  const std::string lock = cache_ + "/.locks/models--org--m/" + sha_ + ".lock";
  fs::create_directories(fs::path(lock).parent_path());
  fs::create_symlink(outside_ + "/precious", lock);
  auto r = download();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kPermissionDenied) << r.status().to_string();
  expect_outside_untouched();  // not chmod-ed to 0666 through the link
  // vLLM's model lock (get_lock) in a shared folder: the same rule.
  const std::string model_lock = lock_file_path("org/m", tmp_.file("locks"));
  fs::create_directories(tmp_.file("locks"));
  fs::create_symlink(outside_ + "/precious", model_lock);
  CrossProcessLock l(model_lock);
  Status s = l.acquire(1);
  EXPECT_EQ(s.code(), Code::kPermissionDenied) << s.to_string();
  expect_outside_untouched();
}

TEST_F(SharedCache, ANeighboursPartialFileIsLeftAloneAndOursHasTheUmasksMode) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to hand a planted partial file to another uid";
  const std::string partial = storage_ + "/blobs/" + sha_ + ".0badf00d.incomplete";
  const std::string junk(model_.size(), 'x');
  write(partial, junk);  // the neighbour's: full size, a journal saying every byte arrived
  write(partial + ".ranges", "weightlift-ranges 1\n" + sha_ + " " + std::to_string(model_.size()) + "\n0 " +
                                 std::to_string(model_.size()) + "\n");
  ASSERT_EQ(::chown(partial.c_str(), kNeighbour, kNeighbour), 0);
  ASSERT_EQ(::chown((partial + ".ranges").c_str(), kNeighbour, kNeighbour), 0);
  const mode_t old = ::umask(027);
  auto r = download();
  ::umask(old);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(slurp(*r + "/model.safetensors"), model_);  // not the neighbour's bytes
  EXPECT_EQ(slurp(partial), junk);                      // left as it was
  struct stat st {};
  ASSERT_EQ(::stat(partial.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNeighbour);
  ASSERT_EQ(::stat((storage_ + "/blobs/" + sha_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u) << "the blob's mode comes from the umask";
  // A hard link to a file elsewhere is no partial of ours either (two links).
  fs::remove_all(cache_);
  fs::create_directories(storage_ + "/blobs");
  const std::string linked = storage_ + "/blobs/" + sha_ + ".11111111.incomplete";
  write(outside_ + "/victim", junk);
  ASSERT_EQ(::link((outside_ + "/victim").c_str(), linked.c_str()), 0);
  r = download();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(slurp(outside_ + "/victim"), junk);
  fs::remove(outside_ + "/victim");
  expect_outside_untouched();
}

TEST_F(SharedCache, AnotherUserRunningTheCliCannotBeMadeToWriteOutside) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the CLI as another uid (setpriv)";
  if (::access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no setpriv";
  // The victim (uid 65534) downloads into a world-writable shared cache where root planted links to a
  // file of the victim's (which a write through the link would overwrite).
  ASSERT_EQ(::chown((outside_ + "/precious").c_str(), kNeighbour, kNeighbour), 0);
  fs::create_directories(storage_ + "/blobs");
  fs::permissions(tmp_.path(), fs::perms::all);
  for (const auto& d : {cache_, storage_, storage_ + "/blobs"}) fs::permissions(d, fs::perms::all);
  const std::string partial = storage_ + "/blobs/" + sha_ + ".deadbeef.incomplete";
  fs::create_symlink(outside_ + "/precious", partial);
  fs::create_symlink(outside_ + "/precious", partial + ".ranges");
  auto r = run_command({"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env",
                        "HF_ENDPOINT=" + server().main("/hub/ok"), "HF_HUB_CACHE=" + cache_, "HOME=" + tmp_.path(),
                        WEIGHTLIFT_CLI, "download", "org/m", "--include", "model.safetensors", "-q"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_outside_untouched();
  EXPECT_TRUE(fs::is_symlink(partial));
}

}  // namespace
}  // namespace wl

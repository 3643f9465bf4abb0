// get_lock naming, flock semantics across processes, RAII guard, atomic writer.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/lock.h"

namespace wl {
namespace {

using testing::TempDir;

using testing::ScopedEnv;

// A child process that takes the lock, reports through a pipe, and holds it
// until the parent closes its end of a second pipe.
struct LockHolder {
  pid_t pid = -1;
  int release_fd = -1;

  static LockHolder start(const std::string& path) {
    int ready[2], release[2];
    EXPECT_EQ(::pipe(ready), 0);
    EXPECT_EQ(::pipe(release), 0);
    LockHolder h;
    h.pid = ::fork();
    if (h.pid == 0) {
      ::close(ready[0]);
      ::close(release[1]);
      CrossProcessLock lock(path);
      char ok = lock.acquire().ok() ? 'y' : 'n';
      (void)!::write(ready[1], &ok, 1);
      char c;
      (void)!::read(release[0], &c, 1);  // EOF when the parent lets go
      lock.release();
      ::_exit(ok == 'y' ? 0 : 1);
    }
    ::close(ready[1]);
    ::close(release[0]);
    char ok = 0;
    EXPECT_EQ(::read(ready[0], &ok, 1), 1);
    EXPECT_EQ(ok, 'y');
    ::close(ready[0]);
    h.release_fd = release[1];
    return h;
  }
  int finish() {
    ::close(release_fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST(Lock, NameIsHashPlusModelNameInCacheDir) {
  EXPECT_EQ(lock_file_path("meta-llama/Llama-2-7b-hf", "/cache"),
            "/cache/d33eb618a17b0891cfc7ddc667646db2bee0aff6b19e0b8670f1e4db438730a9meta-llama-Llama-2-7b-hf.lock");
  EXPECT_EQ(lock_file_path("meta-llama/Llama-2-7b-hf", "/cache/"),
            "/cache/d33eb618a17b0891cfc7ddc667646db2bee0aff6b19e0b8670f1e4db438730a9meta-llama-Llama-2-7b-hf.lock");
  // A local path: every '/' becomes '-' before hashing.
  std::string p = lock_file_path("/models/x", "/c");
  EXPECT_NE(p.find("-models-x.lock"), std::string::npos);
  EXPECT_EQ(p.size(), std::string("/c/").size() + 64 + std::string("-models-x.lock").size());
}

TEST(Lock, EmptyCacheDirMeansSystemTempDir) {
  TempDir dir;
  ScopedEnv env("TMPDIR", dir.path().c_str());
  EXPECT_EQ(system_temp_dir(), dir.path());
  EXPECT_EQ(lock_file_path("m", ""), dir.path() + "/" + lock_file_path("m", "x").substr(2));
}

TEST(Lock, TempDirSkipsUnusableTmpdir) {
  ScopedEnv env("TMPDIR", "/nonexistent/weightlift");
  ScopedEnv env2("TEMP", "");
  ScopedEnv env3("TMP", "");
  EXPECT_EQ(system_temp_dir(), "/tmp");
}

TEST(Lock, FileIsWorldWritableWhateverTheUmask) {
  TempDir dir;
  mode_t old = ::umask(077);
  CrossProcessLock lock = get_lock("org/model", dir.path());
  Status st = lock.acquire();
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.to_string();
  struct stat s {};
  ASSERT_EQ(::stat(lock.path().c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0666u);
  lock.release();
}

TEST(Lock, CreatesMissingCacheDirectories) {
  TempDir dir;
  std::string cache = dir.path() + "/a/b/c";
  CrossProcessLock lock = get_lock("org/model", cache);
  ASSERT_TRUE(lock.acquire().ok());
  EXPECT_TRUE(::access(lock.path().c_str(), F_OK) == 0);
}

TEST(Lock, SharedWithAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  mode_t old = ::umask(077);
  CrossProcessLock mine = get_lock("org/model", dir.path());
  Status st = mine.acquire();
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.to_string();
  // A child running as "nobody" opens root's lock file: it must see the lock
  // held, and get it once released.
  auto try_as_nobody = [&]() -> int {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      CrossProcessLock theirs(mine.path());
      auto got = theirs.try_acquire();
      ::_exit(!got.ok() ? 2 : (*got ? 0 : 1));
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  EXPECT_EQ(try_as_nobody(), 1);  // held by us
  mine.release();
  EXPECT_EQ(try_as_nobody(), 0);  // theirs now
}

TEST(Lock, ExcludesAnotherProcess) {
  TempDir dir;
  std::string path = lock_file_path("org/model", dir.path());
  LockHolder holder = LockHolder::start(path);
  CrossProcessLock mine(path);
  auto got = mine.try_acquire();
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
  Status timed_out = mine.acquire(0.2, 0.02);
  EXPECT_EQ(timed_out.code(), Code::kUnavailable);
  EXPECT_NE(timed_out.to_string().find("timed out waiting for the lock"), std::string::npos);
  EXPECT_EQ(timed_out.file(), path);
  EXPECT_EQ(holder.finish(), 0);
  ASSERT_TRUE(mine.acquire(5).ok());
  EXPECT_TRUE(mine.is_locked());
  mine.release();
}

TEST(Lock, BlockingAcquireWaitsForRelease) {
  TempDir dir;
  std::string path = lock_file_path("m", dir.path());
  LockHolder holder = LockHolder::start(path);
  int child_rc = -1;
  std::thread releaser([&] {
    ::usleep(100 * 1000);
    child_rc = holder.finish();
  });
  CrossProcessLock mine(path);
  EXPECT_TRUE(mine.acquire().ok());  // blocks until the child lets go
  releaser.join();
  EXPECT_EQ(child_rc, 0);
}

TEST(Lock, TwoObjectsInOneProcessExcludeEachOther) {
  TempDir dir;
  CrossProcessLock a = get_lock("m", dir.path());
  CrossProcessLock b = get_lock("m", dir.path());
  ASSERT_TRUE(a.acquire().ok());
  EXPECT_FALSE(*b.try_acquire());
  a.release();
  EXPECT_TRUE(*b.try_acquire());
  b.release();
}

TEST(Lock, IsReentrant) {
  TempDir dir;
  CrossProcessLock a = get_lock("m", dir.path());
  CrossProcessLock other = get_lock("m", dir.path());
  ASSERT_TRUE(a.acquire().ok());
  ASSERT_TRUE(a.acquire().ok());
  a.release();
  EXPECT_TRUE(a.is_locked());
  EXPECT_FALSE(*other.try_acquire());
  a.release();
  EXPECT_FALSE(a.is_locked());
  EXPECT_TRUE(*other.try_acquire());
  other.release();
  a.release();  // extra release is harmless
}

TEST(Lock, GuardReleasesOnScopeExit) {
  TempDir dir;
  CrossProcessLock a = get_lock("m", dir.path());
  CrossProcessLock b = get_lock("m", dir.path());
  {
    auto guard = LockGuard::make(a);
    ASSERT_TRUE(guard.ok());
    EXPECT_FALSE(*b.try_acquire());
  }
  EXPECT_FALSE(a.is_locked());
  EXPECT_TRUE(*b.try_acquire());
}

TEST(Lock, UnusableDirectoryIsAnErrorNamingIt) {
  TempDir dir;
  testing::write_bytes(dir.file("plain"), "x");
  CrossProcessLock lock = get_lock("m", dir.file("plain") + "/sub");
  Status st = lock.acquire();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find(dir.file("plain")), std::string::npos) << st.to_string();
}

TEST(Lock, GoesThroughTheEnvAndItsFaults) {
  TempDir dir;
  testing::FaultInjectionEnv env(Env::Default());
  CrossProcessLock lock(lock_file_path("m", dir.path()), &env);
  ASSERT_TRUE(lock.acquire().ok());
  EXPECT_EQ(env.counters().locks.load(), 1u);
  EXPECT_EQ(env.counters().mkdirs.load(), 1u);
  lock.release();
  // The lock file cannot be opened: the error names it, and no lock is held.
  env.add_write({.path_part = ".lock", .lock_errno = EACCES});
  CrossProcessLock denied(lock_file_path("m", dir.path()), &env);
  Status st = denied.acquire();
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.to_string();
  EXPECT_NE(st.message().find("cannot open the lock file"), std::string::npos) << st.to_string();
  EXPECT_EQ(st.file(), lock_file_path("m", dir.path()));
  EXPECT_FALSE(denied.is_locked());
  auto tried = denied.try_acquire();
  EXPECT_EQ(tried.status().code(), Code::kPermissionDenied);
}

TEST(AtomicWrite, ReplacesTextAndBinary) {
  TempDir dir;
  std::string path = dir.file("out.json");
  testing::write_bytes(path, "old");
  ASSERT_TRUE(atomic_write_text(path, "{\"a\": 1}\n").ok());
  EXPECT_EQ(testing::read_bytes(path), "{\"a\": 1}\n");
  std::string binary("\x00\x01\xff\x00", 4);
  ASSERT_TRUE(atomic_write_bytes(path, std::as_bytes(std::span(binary.data(), binary.size()))).ok());
  EXPECT_EQ(testing::read_bytes(path), binary);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"out.json"});
  struct stat s {};
  ASSERT_EQ(::stat(path.c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0600u);  // mkstemp's mode, as the reference leaves it
}

TEST(AtomicWrite, CreatesANewFileInPieces) {
  TempDir dir;
  std::string path = dir.file("new.bin");
  Status st = atomic_write(path, [](AtomicWriter& w) -> Status {
    WL_RETURN_IF_ERROR(w.write("part1,"));
    return w.write("part2");
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(testing::read_bytes(path), "part1,part2");
}

TEST(AtomicWrite, ErrorLeavesOriginalUntouched) {
  TempDir dir;
  std::string path = dir.file("out.txt");
  testing::write_bytes(path, "original");
  Status st = atomic_write(path, [](AtomicWriter& w) -> Status {
    WL_RETURN_IF_ERROR(w.write("half-written"));
    return Status::IoError("disk on fire");
  });
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_EQ(st.to_string(), path + ": disk on fire");
  EXPECT_EQ(testing::read_bytes(path), "original");
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"out.txt"});  // no temporary left
}

TEST(AtomicWrite, ExceptionLeavesOriginalUntouched) {
  TempDir dir;
  std::string path = dir.file("out.txt");
  testing::write_bytes(path, "original");
  Status st = atomic_write(path, [](AtomicWriter& w) -> Status {
    (void)w.write("junk");
    throw std::runtime_error("boom");
  });
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("boom"), std::string::npos);
  EXPECT_EQ(testing::read_bytes(path), "original");
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"out.txt"});
}

TEST(AtomicWrite, MissingDirectoryIsAnError) {
  TempDir dir;
  std::string path = dir.file("no/such/dir/out.txt");
  Status st = atomic_write_text(path, "x");
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_NE(st.to_string().find(path), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace wl

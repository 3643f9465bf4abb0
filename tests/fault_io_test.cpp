// Fault injection through the Env seam: EIO mid-file, files truncated or
// changed while being read, failing opens and listings. Every case must end
// with a clear error (naming the file, and the tensor where there is one) or
// with a correct result.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/checkpoint.h"
#include "weightlift/loader.h"
#include "weightlift/safetensors.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::FaultInjectionEnv;
using testing::FileFault;
using testing::TempDir;

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

// Loads every tensor, checking each one's bytes; returns the load's status.
Status load_and_check(const std::vector<std::string>& files, Strategy strategy, Env* env, size_t* loaded = nullptr) {
  LoadOptions o;
  o.strategy = strategy;
  o.env = env;
  size_t n = 0;
  auto r = load_files(files, o, [&](LoadedTensor&& t) {
    size_t i = std::stoul(t.name.substr(1));
    if (!testing::has_test_bytes(t.view, i)) return Status::Internal("wrong bytes for " + t.name);
    ++n;
    return Status();
  });
  if (loaded) *loaded = n;
  return r.status();
}

class FaultIo : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.file("model.safetensors");
    ASSERT_TRUE(testing::write_test_model(path_, 8, 4096).ok());
  }
  TempDir dir_;
  std::string path_;
};

TEST_F(FaultIo, NoFaultLoadsEverythingInBothStrategies) {
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    FaultInjectionEnv env;
    env.add({.path_suffix = "model.safetensors"});
    size_t n = 0;
    ASSERT_TRUE(load_and_check({path_}, s, &env, &n).ok());
    EXPECT_EQ(n, 8u);
  }
}

TEST_F(FaultIo, EioInTheHeaderFailsTheOpenNamingTheFile) {
  FaultInjectionEnv env;
  env.add({.path_suffix = "model.safetensors", .eio_from_offset = 20});
  for (FileMode m : {FileMode::kMmap, FileMode::kPread}) {
    auto f = SafetensorsFile::open(path_, m, &env);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), Code::kIoError);
    EXPECT_EQ(f.status().file(), path_);
    EXPECT_TRUE(contains(f.status().message(), "Input/output error")) << f.status().to_string();
  }
}

TEST_F(FaultIo, EioMidFileFailsTheLoadNamingFileAndTensor) {
  FaultInjectionEnv env;
  auto probe = SafetensorsFile::open(path_);
  ASSERT_TRUE(probe.ok());
  const TensorInfo& fifth = (*probe)->tensors()[4];
  env.add({.path_suffix = "model.safetensors", .eio_from_offset = fifth.offset + 100});
  size_t n = 0;
  Status s = load_and_check({path_}, Strategy::kLazy, &env, &n);
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.file(), path_);
  EXPECT_EQ(s.tensor(), fifth.name);
  EXPECT_EQ(n, 4u);  // the four tensors before it arrived intact
  // Eager reads the whole file at once: the error names the file.
  s = load_and_check({path_}, Strategy::kEager, &env, &n);
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.file(), path_);
  EXPECT_EQ(n, 0u);
}

TEST_F(FaultIo, EioAfterSomeReadsFailsLaterTensorsOnly) {
  FaultInjectionEnv env;
  env.add({.path_suffix = "model.safetensors", .eio_after_reads = 5});  // length, header, 3 tensors
  auto f = SafetensorsFile::open(path_, FileMode::kMmap, &env);
  ASSERT_TRUE(f.ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*f)->read(fmt::format("t{}", i)).ok());
  auto r = (*f)->read("t3");
  EXPECT_EQ(r.status().code(), Code::kIoError);
  EXPECT_EQ(r.status().tensor(), "t3");
  auto v = (*f)->get("t4");  // the zero-copy path falls back to a read, which fails too
  EXPECT_EQ(v.status().code(), Code::kIoError);
  auto rows = (*f)->read_slice("t5", 0, 0, 10);
  EXPECT_EQ(rows.status().code(), Code::kIoError);
  EXPECT_EQ(rows.status().tensor(), "t5");
}

TEST_F(FaultIo, TruncatedWhileBeingReadIsAnErrorNotGarbage) {
  FaultInjectionEnv env;
  auto size = Env::Default()->file_size(path_);
  ASSERT_TRUE(size.ok());
  env.add({.path_suffix = "model.safetensors", .truncate_to = *size - 6000, .truncate_after_reads = 2});
  size_t n = 0;
  Status s = load_and_check({path_}, Strategy::kLazy, &env, &n);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_TRUE(contains(s.message(), "unexpected end of file")) << s.to_string();
  EXPECT_EQ(s.file(), path_);
  EXPECT_EQ(s.tensor(), "t6");  // the first tensor that reaches past the new end
  EXPECT_EQ(n, 6u);
}

TEST_F(FaultIo, ReallyTruncatedDuringALazyLoadFailsCleanly) {
  // The file on disk shrinks between two tensors: pread sees the end of file
  // (the lazy loader copies with pread, so no SIGBUS from the mapping).
  LoadOptions o;
  size_t n = 0;
  o.progress = [&](const LoadProgress& p) {
    if (p.tensors_done == 2) EXPECT_EQ(::truncate(path_.c_str(), 3000), 0);
    return true;
  };
  auto r = load_files({path_}, o, [&](LoadedTensor&&) {
    ++n;
    return Status();
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_EQ(r.status().file(), path_);
  EXPECT_EQ(r.status().tensor(), "t2");
  EXPECT_EQ(n, 2u);
}

TEST_F(FaultIo, ReplacedByRenameDuringALoadStillGivesTheOldBytes) {
  // Writers that replace files atomically (rename) do not disturb an open
  // reader: it keeps the old inode and gets a consistent result.
  std::string other = dir_.file("other.safetensors");
  ASSERT_TRUE(testing::write_test_model(other, 3, 16).ok());
  for (Strategy s : {Strategy::kLazy, Strategy::kEager}) {
    std::string p = dir_.file(fmt::format("m{}.safetensors", static_cast<int>(s)));
    ASSERT_TRUE(testing::write_test_model(p, 8, 4096).ok());
    LoadOptions o;
    o.strategy = s;
    o.progress = [&](const LoadProgress& pr) {
      if (pr.tensors_done == 1) {
        EXPECT_EQ(::link(other.c_str(), (p + ".new").c_str()), 0);
        EXPECT_EQ(::rename((p + ".new").c_str(), p.c_str()), 0);
      }
      return true;
    };
    size_t n = 0;
    auto r = load_files({p}, o, [&](LoadedTensor&& t) {
      EXPECT_TRUE(testing::has_test_bytes(t.view, std::stoul(t.name.substr(1)))) << t.name;
      EXPECT_EQ(t.view.nbytes(), 4096u);
      ++n;
      return Status();
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(n, 8u);
  }
}

TEST_F(FaultIo, GrownWhileBeingReadUsesTheSizeAtOpen) {
  auto f = SafetensorsFile::open(path_, FileMode::kMmap);
  ASSERT_TRUE(f.ok());
  FILE* out = std::fopen(path_.c_str(), "ab");
  ASSERT_NE(out, nullptr);
  std::fputs("appended bytes", out);
  std::fclose(out);
  for (size_t i = 0; i < 8; ++i) {
    auto t = (*f)->read(fmt::format("t{}", i));
    ASSERT_TRUE(t.ok());
    EXPECT_TRUE(testing::has_test_bytes(t->view(), i));
  }
  // Reopened, the appended bytes break the "data ends at the end of file" rule.
  auto again = SafetensorsFile::open(path_, FileMode::kMmap);
  EXPECT_EQ(again.status().code(), Code::kCorruptData);
  EXPECT_TRUE(contains(again.status().message(), "data area ends at byte")) << again.status().to_string();
}

TEST_F(FaultIo, ChangedInPlaceWhileBeingReadNeverCrashes) {
  // Bytes rewritten underneath the reader cannot be detected without a
  // checksum; what must hold is that nothing crashes or reads out of bounds
  // and every tensor keeps its size.
  FaultInjectionEnv env;
  env.add({.path_suffix = "model.safetensors", .change_after_reads = 4});
  LoadOptions o;
  o.env = &env;
  size_t changed = 0, n = 0;
  auto r = load_files({path_}, o, [&](LoadedTensor&& t) {
    EXPECT_EQ(t.view.nbytes(), 4096u);
    changed += !testing::has_test_bytes(t.view, std::stoul(t.name.substr(1)));
    ++n;
    return Status();
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(n, 8u);
  EXPECT_EQ(changed, 4u);  // the data is read through its own descriptor: its reads 0-3 are the first four tensors
}

TEST_F(FaultIo, HeaderChangedInPlaceBetweenLengthAndBodyIsCorrupt) {
  // The length prefix is read, then the header: if the header bytes change in
  // between, the result is a format error, never an out-of-bounds read.
  FaultInjectionEnv env;
  env.add({.path_suffix = "model.safetensors", .change_after_reads = 1});
  auto f = SafetensorsFile::open(path_, FileMode::kMmap, &env);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kCorruptData);
  EXPECT_EQ(f.status().file(), path_);
}

TEST_F(FaultIo, OpenFailuresNameTheFile) {
  for (int err : {EIO, EMFILE, EACCES, ENOENT}) {
    FaultInjectionEnv env;
    env.add({.path_suffix = "model.safetensors", .open_errno = err});
    Status s = load_and_check({path_}, Strategy::kLazy, &env);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.file(), path_);
    EXPECT_TRUE(contains(s.message(), std::strerror(err))) << s.to_string();
    auto ck = open_checkpoint(path_, &env);
    EXPECT_EQ(ck.status().file(), path_);
  }
}

TEST_F(FaultIo, CheckpointReaderPropagatesReadErrors) {
  FaultInjectionEnv env;
  auto probe = SafetensorsFile::open(path_);
  env.add({.path_suffix = "model.safetensors", .eio_from_offset = (*probe)->tensors()[2].offset});
  auto ck = open_checkpoint(path_, &env);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE((*ck)->read(1).ok());
  EXPECT_EQ((*ck)->read(2).status().code(), Code::kIoError);
  EXPECT_EQ((*ck)->view(3).status().code(), Code::kIoError);
  EXPECT_EQ((*ck)->view(3).status().tensor(), "t3");
}

// find_weight_files reads the index through the Env it is given (it used to
// read it through the default Env, so faults and in-memory Envs missed it).
TEST(FaultWeightFiles, IndexIsReadThroughTheGivenEnv) {
  TempDir dir;
  ASSERT_TRUE(testing::write_test_model(dir.file("model-00001-of-00002.safetensors"), 1, 4).ok());
  ASSERT_TRUE(testing::write_test_model(dir.file("model-00002-of-00002.safetensors"), 1, 4).ok());
  ASSERT_TRUE(testing::write_test_model(dir.file("model.safetensors"), 1, 4).ok());
  testing::write_bytes(
      dir.file("model.safetensors.index.json"),
      R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}})");
  FaultInjectionEnv env;
  auto ok = find_weight_files(dir.path(), &env);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->files.size(), 2u);
  EXPECT_EQ(env.counters().opens.load(), 1u);  // the index, through `env`

  env.add({.path_suffix = "index.json", .eio_from_offset = 10});
  auto bad = find_weight_files(dir.path(), &env);
  EXPECT_EQ(bad.status().code(), Code::kIoError);
  EXPECT_EQ(bad.status().file(), dir.file("model.safetensors.index.json"));
}

TEST(FaultWeightFiles, UnreadableFolderIsAnErrorNamingIt) {
  TempDir dir;
  ASSERT_TRUE(testing::write_test_model(dir.file("model.safetensors"), 1, 4).ok());
  FaultInjectionEnv env;
  env.list_errno = EACCES;
  auto r = find_weight_files(dir.path(), &env);
  EXPECT_EQ(r.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(r.status().file(), dir.path());
}

}  // namespace
}  // namespace wl

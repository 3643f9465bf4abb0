// Fault injection below the Env seam: this test binary interposes pread() and
// pwrite() (the library is linked statically, so its calls resolve to the
// definitions here). Unarmed, they forward to the kernel unchanged. Armed,
// they return short counts, EINTR, EIO or an early end of file, which the
// POSIX Env must turn into exact reads or clear errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <random>

#include "test_util.h"
#include "weightlift/io.h"
#include "weightlift/safetensors.h"
#include "weightlift/tensor.h"

namespace {

enum class Fault { kNone, kShort, kEintr, kEio, kEarlyEof, kNoSpace };
std::atomic<Fault> g_read_fault{Fault::kNone};
std::atomic<Fault> g_write_fault{Fault::kNone};
std::atomic<int> g_calls{0};
std::atomic<uint64_t> g_fault_offset{0};  // kEio / kEarlyEof / kNoSpace from this offset on

ssize_t real_pread(int fd, void* buf, size_t n, off_t off) { return ::syscall(SYS_pread64, fd, buf, n, off); }
ssize_t real_pwrite(int fd, const void* buf, size_t n, off_t off) { return ::syscall(SYS_pwrite64, fd, buf, n, off); }

bool is_direct(int fd) { return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0; }

ssize_t faulty_pread(int fd, void* buf, size_t n, off_t off) {
  const int call = g_calls++;
  switch (g_read_fault.load()) {
    case Fault::kNone: break;
    case Fault::kShort: {
      // A few bytes at a time (whole blocks for O_DIRECT, as the kernel would).
      size_t cap = is_direct(fd) ? 4096 : static_cast<size_t>(1 + call % 13);
      if (n > cap) n = cap;
      break;
    }
    case Fault::kEintr:
      if (call % 2 == 0) {
        errno = EINTR;
        return -1;
      }
      break;
    case Fault::kEio:
      if (static_cast<uint64_t>(off) + n > g_fault_offset) {
        errno = EIO;
        return -1;
      }
      break;
    case Fault::kEarlyEof: {
      // Read what was asked, so that the kernel still refuses what it would
      // refuse (unaligned O_DIRECT reads: EINVAL), then report what remains.
      if (static_cast<uint64_t>(off) >= g_fault_offset) {
        ssize_t r = real_pread(fd, buf, n, off);
        return r < 0 ? r : 0;
      }
      ssize_t r = real_pread(fd, buf, n, off);
      const uint64_t left = g_fault_offset - static_cast<uint64_t>(off);
      return r > 0 && static_cast<uint64_t>(r) > left ? static_cast<ssize_t>(left) : r;
    }
    case Fault::kNoSpace: break;
  }
  return real_pread(fd, buf, n, off);
}

ssize_t faulty_pwrite(int fd, const void* buf, size_t n, off_t off) {
  const int call = g_calls++;
  switch (g_write_fault.load()) {
    case Fault::kShort: {
      size_t cap = static_cast<size_t>(1 + call % 13);
      if (n > cap) n = cap;
      break;
    }
    case Fault::kEintr:
      if (call % 2 == 0) {
        errno = EINTR;
        return -1;
      }
      break;
    case Fault::kNoSpace:
      if (static_cast<uint64_t>(off) + n > g_fault_offset) {
        if (static_cast<uint64_t>(off) < g_fault_offset) {  // a partial write first, as a filling disk does
          n = g_fault_offset - static_cast<uint64_t>(off);
          break;
        }
        errno = ENOSPC;
        return -1;
      }
      break;
    case Fault::kEio: errno = EIO; return -1;
    default: break;
  }
  return real_pwrite(fd, buf, n, off);
}

// Arms a read or write fault for one scope.
struct Armed {
  Armed(std::atomic<Fault>& which, Fault f, uint64_t offset = 0) : which_(which) {
    g_calls = 0;
    g_fault_offset = offset;
    which_ = f;
  }
  ~Armed() { which_ = Fault::kNone; }
  std::atomic<Fault>& which_;
};

}  // namespace

extern "C" {
ssize_t pread(int fd, void* buf, size_t n, off_t off) { return faulty_pread(fd, buf, n, off); }
ssize_t pread64(int fd, void* buf, size_t n, off_t off) { return faulty_pread(fd, buf, n, off); }
ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) { return faulty_pwrite(fd, buf, n, off); }
ssize_t pwrite64(int fd, const void* buf, size_t n, off_t off) { return faulty_pwrite(fd, buf, n, off); }
}

namespace wl {
namespace {

using testing::TempDir;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  std::mt19937_64 rng(3);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

const FileMode kModes[] = {FileMode::kMmap, FileMode::kPread, FileMode::kDirect};

class FaultSyscall : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = pattern(3 * 4096 + 1234);
    path_ = dir_.file("f.bin");
    testing::write_bytes(path_, data_);
  }
  // Reads [off, off+n) in `mode` into a fresh buffer (unaligned when `skew`).
  Status read(FileMode mode, uint64_t off, size_t n, std::string* out, size_t skew = 0) {
    auto f = Env::Default()->open(path_, {.mode = mode});
    if (!f.ok()) return f.status();
    auto buf = Buffer::allocate(n + 4096 + skew, 4096);
    if (!buf.ok()) return buf.status();
    Status s = (*f)->read_at(off, std::span<std::byte>(buf->data() + skew, n));
    out->assign(reinterpret_cast<const char*>(buf->data()) + skew, n);
    return s;
  }
  TempDir dir_;
  std::string path_;
  std::string data_;
};

TEST_F(FaultSyscall, InterposedPreadIsUsed) {
  Armed a(g_read_fault, Fault::kEio, 0);
  std::string out;
  EXPECT_EQ(read(FileMode::kPread, 0, 10, &out).code(), Code::kIoError);
  EXPECT_GT(g_calls.load(), 0);
}

TEST_F(FaultSyscall, ShortReadsAreRetriedToTheFullCount) {
  for (FileMode mode : kModes) {
    for (auto [off, n, skew] : {std::tuple<uint64_t, size_t, size_t>{0, 3 * 4096, 0},
                                {5, 9000, 1},
                                {4096, 8192, 0},
                                {0, 3 * 4096 + 1234, 0},
                                {100, 3 * 4096 + 1134, 7}}) {
      Armed a(g_read_fault, Fault::kShort);
      std::string out;
      Status s = read(mode, off, n, &out, skew);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(out, data_.substr(off, n)) << "mode " << static_cast<int>(mode) << " off " << off;
      EXPECT_GT(g_calls.load(), 1);
    }
  }
}

TEST_F(FaultSyscall, EintrIsRetried) {
  for (FileMode mode : kModes) {
    Armed a(g_read_fault, Fault::kEintr);
    std::string out;
    Status s = read(mode, 3, data_.size() - 3, &out, 1);
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(out, data_.substr(3));
  }
}

TEST_F(FaultSyscall, EioIsAnIoErrorNamingTheFileAndOffset) {
  for (FileMode mode : kModes) {
    Armed a(g_read_fault, Fault::kEio, 8192);
    std::string out;
    EXPECT_TRUE(read(mode, 0, 4096, &out).ok());  // before the bad sector
    Status s = read(mode, 0, data_.size(), &out);
    EXPECT_EQ(s.code(), Code::kIoError);
    EXPECT_EQ(s.file(), path_);
    EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("offset"), std::string::npos) << s.to_string();
  }
}

TEST_F(FaultSyscall, EndOfFileBeforeTheSizeAtOpenIsOutOfRange) {
  // The file was truncated after open: the kernel returns 0 bytes.
  for (FileMode mode : kModes) {
    Armed a(g_read_fault, Fault::kEarlyEof, 5000);
    std::string out;
    Status s = read(mode, 0, data_.size(), &out);
    EXPECT_EQ(s.code(), Code::kOutOfRange) << s.to_string();
    EXPECT_EQ(s.file(), path_);
    EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.to_string();
  }
}

TEST_F(FaultSyscall, SafetensorsHeaderAndTensorsSurviveShortReadsAndEintr) {
  TempDir dir;
  std::string p = dir.file("m.safetensors");
  auto t = Tensor::empty(DType::F32, {1000});
  ASSERT_TRUE(t.ok());
  for (size_t i = 0; i < t->nbytes(); ++i) t->mutable_bytes()[i] = std::byte(i * 13);
  std::vector<NamedTensor> named = {{"w", t->view()}};
  ASSERT_TRUE(write_safetensors(p, named, {{"format", "pt"}}).ok());
  for (Fault f : {Fault::kShort, Fault::kEintr}) {
    for (FileMode m : {FileMode::kMmap, FileMode::kPread}) {
      Armed a(g_read_fault, f);
      auto sf = SafetensorsFile::open(p, m);
      ASSERT_TRUE(sf.ok()) << sf.status().to_string();
      auto r = (*sf)->read("w");
      ASSERT_TRUE(r.ok());
      EXPECT_TRUE(std::equal(r->bytes().begin(), r->bytes().end(), t->bytes().begin()));
    }
  }
}

TEST_F(FaultSyscall, ShortWritesAndEintrStillWriteEveryByte) {
  for (Fault f : {Fault::kShort, Fault::kEintr}) {
    std::string out = dir_.file("out.bin");
    {
      Armed a(g_write_fault, f);
      ASSERT_TRUE(write_file_atomic(out, data_).ok());
    }
    EXPECT_EQ(testing::read_bytes(out), data_);
  }
}

TEST_F(FaultSyscall, NoSpaceMidWriteLeavesNoFileUnderTheFinalName) {
  std::string out = dir_.file("model.safetensors");
  auto t = Tensor::empty(DType::U8, {100000});
  ASSERT_TRUE(t.ok());
  std::vector<NamedTensor> named = {{"w", t->view()}};
  {
    Armed a(g_write_fault, Fault::kNoSpace, 50000);
    Status s = write_safetensors(out, named);
    EXPECT_EQ(s.code(), Code::kIoError);
    EXPECT_EQ(s.file(), out);
    EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.to_string();
  }
  // Neither the final name nor a temporary is left behind.
  EXPECT_EQ(testing::list_dir(dir_.path()), std::vector<std::string>{"f.bin"});
  // An existing file keeps its old contents when its replacement fails.
  testing::write_bytes(out, "old");
  {
    Armed a(g_write_fault, Fault::kEio);
    EXPECT_EQ(write_safetensors(out, named).code(), Code::kIoError);
  }
  EXPECT_EQ(testing::read_bytes(out), "old");
  EXPECT_EQ(testing::list_dir(dir_.path()).size(), 2u);
}

}  // namespace
}  // namespace wl

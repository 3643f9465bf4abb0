// The I/O seam: full reads in every mode, ranges, O_DIRECT alignment, atomic writes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "test_util.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/safetensors.h"
#include "weightlift/tensor.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::TempDir;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  std::mt19937_64 rng(1);
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(RandomAccessFile, EveryModeReadsExactlyTheRequestedBytes) {
  TempDir dir;
  // A size that is not a multiple of the O_DIRECT block, so the tail path runs.
  const std::string data = pattern((3 << 20) + 12345);
  std::string path = dir.file("f.bin");
  testing::write_bytes(path, data);
  std::mt19937_64 rng(9);
  for (FileMode mode : {FileMode::kMmap, FileMode::kPread, FileMode::kDirect}) {
    auto f = Env::Default()->open(path, {.mode = mode});
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    EXPECT_EQ((*f)->size(), data.size());
    for (int i = 0; i < 200; ++i) {
      uint64_t off = rng() % data.size();
      uint64_t n = rng() % std::min<uint64_t>(data.size() - off, i % 10 == 0 ? (2 << 20) : 10000);
      // Unaligned destinations too.
      auto buf = Buffer::allocate(n + 4096 + 1, 4096);
      ASSERT_TRUE(buf.ok());
      size_t skew = (i % 3 == 0) ? 0 : (i % 3 == 1 ? 1 : 512);
      std::span<std::byte> dst(buf->data() + skew, n);
      ASSERT_TRUE((*f)->read_at(off, dst).ok());
      ASSERT_EQ(0, std::memcmp(dst.data(), data.data() + off, n)) << "mode " << int(mode) << " off " << off;
    }
    // Whole file, aligned.
    auto all = Buffer::allocate(data.size(), 4096);
    ASSERT_TRUE((*f)->read_at(0, all->span()).ok());
    EXPECT_EQ(0, std::memcmp(all->data(), data.data(), data.size()));
  }
}

TEST(RandomAccessFile, ReadsPastTheEndAreOutOfRange) {
  TempDir dir;
  std::string path = dir.file("f.bin");
  testing::write_bytes(path, "0123456789");
  for (FileMode mode : {FileMode::kMmap, FileMode::kPread, FileMode::kDirect}) {
    auto f = Env::Default()->open(path, {.mode = mode});
    ASSERT_TRUE(f.ok());
    std::byte b[8];
    auto s = (*f)->read_at(5, b);
    EXPECT_EQ(s.code(), Code::kOutOfRange);
    EXPECT_EQ(s.file(), path);
    EXPECT_EQ((*f)->read_at(UINT64_MAX - 2, b).code(), Code::kOutOfRange);  // offset + n overflows
    EXPECT_TRUE((*f)->read_at(2, b).ok());
  }
}

TEST(RandomAccessFile, MmapViewsAreZeroCopyAndOthersAreNot) {
  TempDir dir;
  std::string path = dir.file("f.bin");
  testing::write_bytes(path, "abcdef");
  auto m = Env::Default()->open(path, {.mode = FileMode::kMmap});
  auto v = (*m)->view(2, 3);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(v->data()), 3), "cde");
  EXPECT_EQ((*m)->view(4, 3).status().code(), Code::kOutOfRange);
  auto p = Env::Default()->open(path, {.mode = FileMode::kPread});
  EXPECT_EQ((*p)->view(0, 1).status().code(), Code::kUnimplemented);
  (*m)->advise(0, 6, Advice::kWillNeed);  // hints never fail
}

TEST(RandomAccessFile, PopulateKeepsAPrivateMappingCopyOnWriteAndReleaseRefaults) {
  TempDir dir;
  std::string path = dir.file("f.bin");
  constexpr size_t kHuge = size_t{2} << 20;
  std::string data = pattern(3 * kHuge + 100);
  testing::write_bytes(path, data);
  for (bool at_open : {true, false}) {
    auto m = Env::Default()->open(path, {.mode = FileMode::kMmapPrivate, .populate = at_open});
    ASSERT_TRUE(m.ok());
    if (!at_open) (*m)->advise(0, data.size(), Advice::kPopulate);
    auto v = (*m)->view(0, data.size());
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(v->data()), data.size()), data);
    auto* w = const_cast<std::byte*>(v->data());
    // Writes are this process's only. Releasing [kHuge - 10, 2*kHuge + 10) drops
    // the one 2 MiB stretch wholly inside it: its write is gone (the file's byte
    // comes back); a write outside whole stretches stays.
    w[kHuge + 5] = std::byte{0x7f};
    w[kHuge - 5] = std::byte{0x11};
    (*m)->advise(kHuge - 10, kHuge + 20, Advice::kRelease);
    EXPECT_EQ(static_cast<char>(w[kHuge + 5]), data[kHuge + 5]);
    EXPECT_EQ(w[kHuge - 5], std::byte{0x11});
    (*m)->advise(0, 0, Advice::kRelease);  // empty ranges are fine
  }
  EXPECT_EQ(testing::read_bytes(path), data);  // nothing reached the file
}

TEST(RandomAccessFile, TheResidencyOfARangeIsCountedExactly) {
  TempDir dir;
  std::string path = dir.file("f.bin");
  testing::write_bytes(path, pattern(4 << 20));
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // out of the page cache
  auto f = Env::Default()->open(path, {.mode = FileMode::kMmap});
  ASSERT_TRUE(f.ok());
  const double cold = (*f)->cached_fraction_in(0, 4 << 20);
  if (cold < 0) GTEST_SKIP() << "no cachestat() on this kernel";
  if (cold >= 0.5) GTEST_SKIP() << "this filesystem keeps the pages (tmpfs?)";
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // no kernel read-ahead around it
  char buf[4096];
  ASSERT_EQ(::pread(fd, buf, sizeof buf, 1 << 20), static_cast<ssize_t>(sizeof buf));  // one page read in
  ::close(fd);
  EXPECT_EQ((*f)->cached_fraction_in(1 << 20, 4096), 1.0);
  EXPECT_EQ((*f)->cached_fraction_in((1 << 20) + 100, 10), 1.0);  // the page holding the range
  EXPECT_LE((*f)->cached_fraction_in(2 << 20, 1 << 20), 0.5);
  EXPECT_EQ((*f)->cached_fraction_in(5 << 20, 10), -1.0);  // past the end: not told
  EXPECT_EQ((*f)->cached_fraction_in(0, 0), -1.0);
}

TEST(RandomAccessFile, ShrinkingAFileGivesAnErrorNotACrash) {
  TempDir dir;
  std::string path = dir.file("f.bin");
  testing::write_bytes(path, pattern(100000));
  auto f = Env::Default()->open(path, {.mode = FileMode::kMmap});
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  std::vector<std::byte> buf(50000);
  auto s = (*f)->read_at(10000, buf);  // read_at uses pread, so no SIGBUS
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos);
}

TEST(Env, OpenErrorsNameTheFile) {
  auto f = Env::Default()->open("/no/such/file");
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_EQ(f.status().file(), "/no/such/file");
  TempDir dir;
  auto d = Env::Default()->open(dir.path());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_NE(d.status().message().find("directory"), std::string::npos);
  testing::write_bytes(dir.file("b"), "x");
  testing::write_bytes(dir.file("a"), "y");
  auto ls = Env::Default()->list_dir(dir.path());
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ(ls->size(), 2u);
  EXPECT_EQ((*ls)[0].name, "a");
  EXPECT_EQ(Env::Default()->list_dir("/no/such").status().code(), Code::kNotFound);
}

// A weight file that is a FIFO, a socket or a device is refused before it is
// read (a FIFO used to make ls and load wait for a writer forever), in every
// mode, directly or through a symlink, with the path and what it is. SIGALRM
// ends the test process if anything blocks.
TEST(Env, OnlyRegularFilesAreOpened) {
  TempDir dir;
  const std::string fifo = dir.file("fifo.safetensors"), sock = dir.file("sock.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  int sfd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sfd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(sfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::symlink(fifo.c_str(), dir.file("to-fifo.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("/dev/null", dir.file("to-null.safetensors").c_str()), 0);
  ::alarm(60);
  struct Case {
    std::string path, what;
  };
  for (const Case& c : {Case{fifo, "a FIFO"}, Case{sock, "a socket"}, Case{dir.file("to-fifo.safetensors"), "a FIFO"},
                        Case{dir.file("to-null.safetensors"), "a character device"}}) {
    for (FileMode mode : {FileMode::kMmap, FileMode::kPread, FileMode::kDirect}) {
      SCOPED_TRACE(c.path);
      auto f = Env::Default()->open(c.path, {.mode = mode});
      ASSERT_FALSE(f.ok());
      EXPECT_EQ(f.status().code(), Code::kInvalidArgument);
      EXPECT_EQ(f.status().file(), c.path);
      EXPECT_NE(f.status().message().find(c.what), std::string::npos) << f.status().to_string();
      EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status().to_string();
    }
    auto st = SafetensorsFile::open(c.path);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().file(), c.path);
    EXPECT_EQ(read_file_to_string(c.path, 1 << 20).status().code(), Code::kInvalidArgument);
  }
  // A model folder whose only weight file is a FIFO, and one whose index is: the load names it.
  TempDir model;
  ASSERT_EQ(::mkfifo(model.file("model.safetensors").c_str(), 0644), 0);
  auto wf = find_weight_files(model.path());
  ASSERT_TRUE(wf.ok()) << wf.status().to_string();
  auto r = load_files(wf->files, {}, [](LoadedTensor&&) { return Status(); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().file(), model.file("model.safetensors"));
  EXPECT_NE(r.status().message().find("a FIFO"), std::string::npos) << r.status().to_string();
  TempDir indexed;
  testing::write_bytes(indexed.file("model-00001-of-00001.safetensors"), "x");
  ASSERT_EQ(::mkfifo(indexed.file("model.safetensors.index.json").c_str(), 0644), 0);
  auto idx = find_weight_files(indexed.path());
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().file(), indexed.file("model.safetensors.index.json"));
  EXPECT_NE(idx.status().message().find("a FIFO"), std::string::npos) << idx.status().to_string();
  ::alarm(0);
  ::close(sfd);
}

TEST(AtomicFile, CommitReplacesAndAbandonLeavesOriginal) {
  TempDir dir;
  std::string path = dir.file("out");
  testing::write_bytes(path, "original");
  {
    auto f = AtomicFile::create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->append(std::string_view("partial")).ok());
    // destroyed without commit: as if the writer failed
  }
  EXPECT_EQ(testing::read_bytes(path), "original");
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"out"});
  {
    auto f = AtomicFile::create(path, 0644);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->resize(10).ok());
    ASSERT_TRUE(f->write_at(5, std::as_bytes(std::span("world", 5))).ok());
    ASSERT_TRUE(f->write_at(0, std::as_bytes(std::span("hello", 5))).ok());
    ASSERT_TRUE(f->commit().ok());
    EXPECT_FALSE(f->commit().ok());
  }
  EXPECT_EQ(testing::read_bytes(path), "helloworld");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0600, 0600u);
  EXPECT_EQ(testing::list_dir(dir.path()), std::vector<std::string>{"out"});
}

TEST(AtomicFile, CreateInMissingDirectoryFails) {
  auto f = AtomicFile::create("/no/such/dir/out");
  EXPECT_EQ(f.status().code(), Code::kNotFound);
  EXPECT_EQ(f.status().file(), "/no/such/dir/out");
}

// Every file this Env creates is /dev/full (ENOSPC on every write); the
// temporary's name is still created and removed through the target Env.
class FullDiskEnv final : public EnvWrapper {
 public:
  FullDiskEnv() : EnvWrapper(Env::Default()) {}
  Result<std::unique_ptr<WritableFile>> new_writable(const std::string& path, const WriteOptions& o) override {
    WL_ASSIGN_OR_RETURN(auto placeholder, target()->new_writable(path, o));
    (void)placeholder->close();
    return target()->new_writable("/dev/full", {.truncate = false});
  }
};

TEST(AtomicFile, FullDiskIsAnIoErrorAndLeavesNothing) {
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "/dev/full not available";
  TempDir dir;
  std::string path = dir.file("out");
  FullDiskEnv env;
  {
    auto f = AtomicFile::create(path, 0644, &env);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    auto s = f->append(std::string_view("data"));
    EXPECT_EQ(s.code(), Code::kIoError);
    EXPECT_NE(s.message().find("No space"), std::string::npos) << s.to_string();
    EXPECT_EQ(s.file(), path);
  }
  EXPECT_TRUE(testing::list_dir(dir.path()).empty());  // the temporary is gone, no final file
}

TEST(ReadFileToString, EnforcesTheLimit) {
  TempDir dir;
  testing::write_bytes(dir.file("f"), "0123456789");
  EXPECT_EQ(*read_file_to_string(dir.file("f")), "0123456789");
  EXPECT_EQ(read_file_to_string(dir.file("f"), 5).status().code(), Code::kOutOfRange);
}

}  // namespace
}  // namespace wl

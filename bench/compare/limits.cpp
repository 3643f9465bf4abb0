// The machine's limits, measured in the same run as the loaders:
//   limits memcpy             single-thread memcpy bandwidth (1 GiB, pre-faulted, best of 3)
//   limits odirect T FILE...  O_DIRECT sequential read of the files, 16 MiB reads,
//                             T threads each reading a contiguous share (page cache bypassed)
// Prints one JSON object.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  if (mode == "memcpy") {
    const size_t n = size_t{1} << 30;
    char* a = static_cast<char*>(std::aligned_alloc(1 << 21, n));
    char* b = static_cast<char*>(std::aligned_alloc(1 << 21, n));
    if (!a || !b) return 1;
    std::memset(a, 1, n);
    std::memset(b, 2, n);
    double best = 1e9;
    for (int i = 0; i < 3; ++i) {
      double t0 = now();
      std::memcpy(b, a, n);
      best = std::min(best, now() - t0);
    }
    std::printf("{\"limit\": \"memcpy (1 thread)\", \"seconds\": %.6f, \"bytes\": %zu, \"check\": %d}\n", best, n,
                b[n / 2]);
    return 0;
  }
  if (mode == "odirect" && argc >= 4) {
    int threads = std::atoi(argv[2]);
    struct Part {
      int fd;
      size_t off, len;
    };
    std::vector<Part> parts;
    size_t total = 0;
    std::vector<std::pair<int, size_t>> files;
    for (int i = 3; i < argc; ++i) {
      int fd = ::open(argv[i], O_RDONLY | O_DIRECT);
      if (fd < 0) {
        std::perror(argv[i]);
        return 1;
      }
      size_t sz = static_cast<size_t>(::lseek(fd, 0, SEEK_END)) & ~size_t(4095);
      files.push_back({fd, sz});
      total += sz;
    }
    const size_t blk = size_t{16} << 20;
    // Split the concatenated files into `threads` contiguous shares.
    std::vector<std::vector<Part>> shares(threads);
    size_t per = (total / threads + 4095) & ~size_t(4095), pos = 0;
    for (auto& [fd, sz] : files) {
      for (size_t o = 0; o < sz;) {
        size_t t = std::min<size_t>(pos / per, threads - 1);
        size_t end_of_share = (t + 1) * per;
        size_t n = std::min(sz - o, t + 1 == static_cast<size_t>(threads) ? sz - o : end_of_share - pos);
        shares[t].push_back({fd, o, n});
        o += n, pos += n;
      }
    }
    std::atomic<size_t> done{0};
    double t0 = now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        void* buf = nullptr;
        if (posix_memalign(&buf, 4096, blk)) return;
        for (auto& p : shares[t])
          for (size_t o = p.off; o < p.off + p.len; o += blk) {
            ssize_t r = ::pread(p.fd, buf, std::min(blk, p.off + p.len - o), static_cast<off_t>(o));
            if (r <= 0) break;
            done += static_cast<size_t>(r);
          }
        std::free(buf);
      });
    for (auto& t : ts) t.join();
    double secs = now() - t0;
    std::printf("{\"limit\": \"O_DIRECT read (%d thread%s)\", \"seconds\": %.6f, \"bytes\": %zu}\n", threads,
                threads == 1 ? "" : "s", secs, done.load());
    return 0;
  }
  return 2;
}

// libweightlift_mpi.so: the MPI side of src/dist/mpi_abi.h. Only this file
// includes mpi.h and links libmpi; the core loads it with dlopen.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/mpi_abi.h"

namespace {

std::mutex g_mu;
int g_users = 0;
bool g_we_initialized = false;

int mpi_fail(int rc, const char* what, char* err, size_t errlen) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", rc);
  std::snprintf(err, errlen, "%s: %s", what, text);
  return rc == 0 ? -1 : rc;
}

// Blocking collectives (MPI's own algorithms and progress, far faster than
// polling a non-blocking one from here) under a watchdog: a call that has
// not returned by its deadline prints why and ends this process, and mpirun
// then ends the job, so no rank waits forever on a rank that hangs.
class Watchdog {
 public:
  void arm(const char* what, int64_t timeout_ms) {
    if (timeout_ms < 0) return;
    std::lock_guard lk(mu_);
    if (!started_) {  // lives as long as the process (the watchdog is never destroyed)
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    what_ = what;
    timeout_ms_ = timeout_ms;
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    armed_ = true;
    cv_.notify_all();
  }
  void disarm() {
    std::lock_guard lk(mu_);
    armed_ = false;
  }
  void set_rank(int rank, int size) {
    std::lock_guard lk(mu_);
    rank_ = rank, size_ = size;
  }

 private:
  [[noreturn]] void loop() {
    std::unique_lock lk(mu_);
    while (true) {
      if (!armed_) {
        cv_.wait(lk);
        continue;
      }
      if (cv_.wait_until(lk, deadline_) == std::cv_status::timeout && armed_ &&
          std::chrono::steady_clock::now() >= deadline_) {
        std::fprintf(stderr,
                     "weightlift: error: rank %d of %d: %s: the other ranks did not answer within %lld ms; "
                     "aborting the MPI job\n",
                     rank_, size_, what_, static_cast<long long>(timeout_ms_));
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool armed_ = false;
  const char* what_ = "";
  int64_t timeout_ms_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  int rank_ = 0, size_ = 0;
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: its thread may outlive static destructors
  return *w;
}

struct Armed {
  Armed(const char* what, int64_t timeout_ms) { watchdog().arm(what, timeout_ms); }
  ~Armed() { watchdog().disarm(); }
};

bool fits_int(uint64_t n, const char* what, char* err, size_t errlen) {
  if (n <= static_cast<uint64_t>(INT_MAX)) return true;
  std::snprintf(err, errlen, "%s: %llu bytes is more than one MPI call moves", what,
                static_cast<unsigned long long>(n));
  return false;
}

int wl_init(int* rank, int* size, char* err, size_t errlen) {
  std::lock_guard lk(g_mu);
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) {
    std::snprintf(err, errlen, "MPI was already finalized in this process");
    return -1;
  }
  if (!inited) {
    int provided = 0;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread", err, errlen);
    g_we_initialized = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = MPI_Comm_rank(MPI_COMM_WORLD, rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(MPI_COMM_WORLD, size);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_rank", err, errlen);
  watchdog().set_rank(*rank, *size);
  ++g_users;
  return 0;
}

int wl_all_gather(void* buf, uint64_t block, int64_t timeout_ms, char* err, size_t errlen) {
  if (!fits_int(block, "MPI_Allgather", err, errlen)) return -1;
  Armed a("MPI_Allgather", timeout_ms);
  int rc = MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, static_cast<int>(block), MPI_BYTE, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Allgather", err, errlen);
}

int wl_broadcast(void* buf, uint64_t n, int root, int64_t timeout_ms, char* err, size_t errlen) {
  if (!fits_int(n, "MPI_Bcast", err, errlen)) return -1;
  Armed a("MPI_Bcast", timeout_ms);
  int rc = MPI_Bcast(buf, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Bcast", err, errlen);
}

int wl_all_gather_u64(uint64_t mine, uint64_t* lens, int64_t timeout_ms, char* err, size_t errlen) {
  Armed a("MPI_Allgather", timeout_ms);
  int rc = MPI_Allgather(&mine, 1, MPI_UINT64_T, lens, 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Allgather", err, errlen);
}

int wl_all_gather_v(const void* mine, const uint64_t* lens, void* out, int64_t timeout_ms, char* err, size_t errlen) {
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  uint64_t total = 0;
  for (int k = 0; k < size; ++k) {
    if (!fits_int(total + lens[k], "MPI_Allgatherv", err, errlen)) return -1;
    counts[static_cast<size_t>(k)] = static_cast<int>(lens[k]);
    displs[static_cast<size_t>(k)] = static_cast<int>(total);
    total += lens[k];
  }
  Armed a("MPI_Allgatherv", timeout_ms);
  int rc = MPI_Allgatherv(mine, counts[static_cast<size_t>(rank)], MPI_BYTE, out, counts.data(), displs.data(),
                          MPI_BYTE, MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "MPI_Allgatherv", err, errlen);
}

void wl_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void wl_finalize() {
  std::lock_guard lk(g_mu);
  if (g_users > 0 && --g_users == 0 && g_we_initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

const WlMpiApi kApi = {kWlMpiAbiVersion,  wl_init,         wl_all_gather, wl_broadcast,
                       wl_all_gather_u64, wl_all_gather_v, wl_abort,      wl_finalize};

}  // namespace

extern "C" __attribute__((visibility("default"))) const WlMpiApi* wl_mpi_api(void) { return &kApi; }

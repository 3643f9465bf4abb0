// libweightlift_mpi.so: the MPI side of src/dist/mpi_abi.h. Only this file
// includes mpi.h and links libmpi; the core loads it with dlopen.
#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <climits>
#include <cstdio>
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

// Polls a non-blocking collective until it completes or the timeout passes:
// spinning (with sched_yield) for the first 5 ms, then napping 50 us
// between tests, so that idle ranks leave the cores to the ranks reading.
int wait_for(MPI_Request* req, int64_t timeout_ms, const char* what, char* err, size_t errlen) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    int done = 0;
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, what, err, errlen);
    if (done) return 0;
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (timeout_ms >= 0 && waited > std::chrono::milliseconds(timeout_ms)) {
      std::snprintf(err, errlen, "%s: the other ranks did not answer within %lld ms", what,
                    static_cast<long long>(timeout_ms));
      return kWlMpiTimeout;
    }
    if (waited < std::chrono::milliseconds(5)) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

bool fits_int(uint64_t n, const char* what, char* err, size_t errlen) {
  if (n <= static_cast<uint64_t>(INT_MAX)) return true;
  std::snprintf(err, errlen, "%s: %llu bytes is more than one MPI call moves", what, static_cast<unsigned long long>(n));
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
  ++g_users;
  return 0;
}

int wl_all_gather(void* buf, uint64_t block, int64_t timeout_ms, char* err, size_t errlen) {
  if (!fits_int(block, "MPI_Iallgather", err, errlen)) return -1;
  MPI_Request req;
  int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, static_cast<int>(block), MPI_BYTE, MPI_COMM_WORLD,
                          &req);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgather", err, errlen);
  return wait_for(&req, timeout_ms, "MPI_Iallgather", err, errlen);
}

int wl_broadcast(void* buf, uint64_t n, int root, int64_t timeout_ms, char* err, size_t errlen) {
  if (!fits_int(n, "MPI_Ibcast", err, errlen)) return -1;
  MPI_Request req;
  int rc = MPI_Ibcast(buf, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibcast", err, errlen);
  return wait_for(&req, timeout_ms, "MPI_Ibcast", err, errlen);
}

int wl_all_gather_u64(uint64_t mine, uint64_t* lens, int64_t timeout_ms, char* err, size_t errlen) {
  MPI_Request req;
  int rc = MPI_Iallgather(&mine, 1, MPI_UINT64_T, lens, 1, MPI_UINT64_T, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgather", err, errlen);
  return wait_for(&req, timeout_ms, "MPI_Iallgather", err, errlen);
}

int wl_all_gather_v(const void* mine, const uint64_t* lens, void* out, int64_t timeout_ms, char* err, size_t errlen) {
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  uint64_t total = 0;
  for (int k = 0; k < size; ++k) {
    if (!fits_int(total + lens[k], "MPI_Iallgatherv", err, errlen)) return -1;
    counts[static_cast<size_t>(k)] = static_cast<int>(lens[k]);
    displs[static_cast<size_t>(k)] = static_cast<int>(total);
    total += lens[k];
  }
  MPI_Request req;
  int rc = MPI_Iallgatherv(mine, counts[static_cast<size_t>(rank)], MPI_BYTE, out, counts.data(), displs.data(),
                           MPI_BYTE, MPI_COMM_WORLD, &req);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgatherv", err, errlen);
  return wait_for(&req, timeout_ms, "MPI_Iallgatherv", err, errlen);
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

const WlMpiApi kApi = {kWlMpiAbiVersion, wl_init,        wl_all_gather, wl_broadcast, wl_all_gather_u64,
                       wl_all_gather_v,  wl_abort,       wl_finalize};

}  // namespace

extern "C" __attribute__((visibility("default"))) const WlMpiApi* wl_mpi_api(void) { return &kApi; }

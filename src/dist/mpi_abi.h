// The C interface between the core and libweightlift_mpi.so (src/dist/mpi/),
// which the core dlopen()s on first use, so that one build runs on machines
// with and without MPI. Private header; both sides include it. Bump
// kWlMpiAbiVersion on any change.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

inline constexpr int kWlMpiAbiVersion = 1;

// Every function returns 0 on success or an MPI error code, with a message
// written to err (NUL-terminated, at most errlen bytes). Calls on
// MPI_COMM_WORLD, blocking; one that has not returned within timeout_ms
// (< 0: no limit) prints why and ends the process (_Exit(1)), and mpirun
// then ends the job.
struct WlMpiApi {
  int abi_version;
  // MPI_Init_thread (MPI_THREAD_SERIALIZED) unless MPI is already
  // initialised; counts users, so that the last finalize() finalizes.
  int (*init)(int* rank, int* size, char* err, size_t errlen);
  // In place: buf holds size blocks of `block` bytes, this rank's filled.
  int (*all_gather)(void* buf, uint64_t block, int64_t timeout_ms, char* err, size_t errlen);
  int (*broadcast)(void* buf, uint64_t n, int root, int64_t timeout_ms, char* err, size_t errlen);
  // lens[k] = rank k's `mine`.
  int (*all_gather_u64)(uint64_t mine, uint64_t* lens, int64_t timeout_ms, char* err, size_t errlen);
  // Rank k's lens[k] bytes land at out + sum(lens[0..k)).
  int (*all_gather_v)(const void* mine, const uint64_t* lens, void* out, int64_t timeout_ms, char* err, size_t errlen);
  // MPI_Abort(MPI_COMM_WORLD, code): ends every rank of the job.
  void (*abort)(int code);
  void (*finalize)(void);
};

// The one symbol the core looks up.
const WlMpiApi* wl_mpi_api(void);
}

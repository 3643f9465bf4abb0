// The entry points weightlift calls, as plain C function types (no CUDA
// header needed): the CUDA runtime, the CUDA driver, cuFile, NCCL and our own
// kernels (libweightlift_cuda.so). One instance of these tables is filled at
// run time, either from the real libraries (dlopen, src/gpu/loader.cpp) or by
// the host fake backend (src/gpu/fake.cpp). Private header; also compiled by
// nvcc (C++17) for src/cuda/backend.cu, which fills WlCudaApi.
//
// Conventions: every `int` result is the library's own status code, 0 meaning
// success (cudaSuccess, CUDA_SUCCESS, CU_FILE_SUCCESS, ncclSuccess). Streams,
// events, cuFile handles and NCCL communicators are opaque pointers.
// Bump kWlCudaAbiVersion on any change to WlCudaApi or WlCudaRuntime.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "weightlift/dummy_kernel.h"

extern "C" {

inline constexpr int kWlCudaAbiVersion = 3;

// cudaMemcpyKind values.
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr int kCudaMemcpyDeviceToHost = 2;
inline constexpr int kCudaMemcpyDefault = 4;
// Flags.
inline constexpr unsigned kCudaHostAllocPortable = 1;
inline constexpr unsigned kCudaStreamNonBlocking = 1;
inline constexpr unsigned kCudaEventDisableTiming = 2;
inline constexpr unsigned kCudaHostRegisterPortable = 1;
inline constexpr unsigned kCudaHostRegisterReadOnly = 8;
// cudaDeviceAttr values.
inline constexpr int kCudaDevAttrHostRegisterReadOnlySupported = 113;
// Status codes the engine tells apart.
inline constexpr int kCudaErrorNotReady = 600;
inline constexpr int kCudaErrorInsufficientDriver = 35;
inline constexpr int kCudaErrorNoDevice = 100;
inline constexpr int kCudaErrorInvalidValue = 1;
inline constexpr int kCudaErrorMemoryAllocation = 2;
inline constexpr int kCudaErrorUnknown = 999;
inline constexpr int kCudaErrorHostMemoryAlreadyRegistered = 712;
inline constexpr int kCudaErrorHostMemoryNotRegistered = 713;
inline constexpr int kCudaErrorNotSupported = 801;
inline constexpr int kCuErrorNoDevice = 100;      // CUDA_ERROR_NO_DEVICE
inline constexpr int kCuErrorStubLibrary = 34;    // CUDA_ERROR_STUB_LIBRARY
inline constexpr int kCuErrorNotInitialized = 3;  // CUDA_ERROR_NOT_INITIALIZED

// The CUDA runtime (libcudart): the subset weightlift uses.
struct WlCudaRuntime {
  int (*getDeviceCount)(int* count);
  int (*setDevice)(int device);
  int (*getDevice)(int* device);
  int (*malloc)(void** ptr, size_t bytes);
  int (*free)(void* ptr);
  int (*hostAlloc)(void** ptr, size_t bytes, unsigned flags);
  int (*freeHost)(void* ptr);
  int (*memcpy)(void* dst, const void* src, size_t bytes, int kind);
  int (*memcpyAsync)(void* dst, const void* src, size_t bytes, int kind, void* stream);
  int (*streamCreateWithFlags)(void** stream, unsigned flags);
  int (*streamDestroy)(void* stream);
  int (*streamSynchronize)(void* stream);
  int (*eventCreateWithFlags)(void** event, unsigned flags);
  int (*eventDestroy)(void* event);
  int (*eventRecord)(void* event, void* stream);
  int (*eventSynchronize)(void* event);
  int (*eventQuery)(void* event);
  int (*memGetInfo)(size_t* free_bytes, size_t* total_bytes);
  int (*runtimeGetVersion)(int* version);
  int (*getLastError)(void);
  const char* (*getErrorString)(int error);
  // Host memory the caller owns, page-locked for DMA (a file's mapping).
  int (*hostRegister)(void* ptr, size_t bytes, unsigned flags);
  int (*hostUnregister)(void* ptr);
  int (*deviceGetAttribute)(int* value, int attr, int device);
};

// The CUDA driver (libcuda.so.1): only what telling "no driver" from "no
// device" needs.
struct WlCudaDriver {
  int (*init)(unsigned flags);
  int (*deviceGetCount)(int* count);
  int (*driverGetVersion)(int* version);
  int (*getErrorString)(int error, const char** text);
};

// cuFile (libcufile.so.0), the ABI of cufile.h 1.x: CUfileError_t is
// {CUfileOpError err; CUresult cu_err;}, returned by value; CUfileDescr_t is
// {int type; union {int fd; void* handle;} handle; const void* fs_ops;}.
struct WlCuFileError {
  int err;
  int cu_err;
};
struct WlCuFileDescr {
  int type;  // 1: CU_FILE_HANDLE_TYPE_OPAQUE_FD
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};
inline constexpr int kCuFileHandleTypeOpaqueFd = 1;
// CUfileDrvProps_t.
struct WlCuFileDrvProps {
  struct {
    unsigned int major_version;  // of the nvidia-fs driver; 0.0 when it is not loaded
    unsigned int minor_version;
    size_t poll_thresh_size;
    size_t max_direct_io_size;
    unsigned int dstatusflags;  // bit k: kCuFile*Supported
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;
  unsigned int per_buffer_cache_size;
  unsigned int max_device_pinned_mem_size;
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
};
// CUfileDriverStatusFlags: which storage the driver reads GPU-direct.
inline constexpr int kCuFileLustreSupported = 0;
inline constexpr int kCuFileWekafsSupported = 1;
inline constexpr int kCuFileNfsSupported = 2;
inline constexpr int kCuFileGpfsSupported = 3;
inline constexpr int kCuFileNvmeSupported = 4;
inline constexpr int kCuFileNvmeofSupported = 5;
inline constexpr int kCuFileBeegfsSupported = 9;
inline constexpr int kCuFileNvmeP2pSupported = 11;
struct WlCuFile {
  WlCuFileError (*driverOpen)(void);
  WlCuFileError (*handleRegister)(void** handle, WlCuFileDescr* descr);
  void (*handleDeregister)(void* handle);
  WlCuFileError (*bufRegister)(const void* device_ptr, size_t bytes, int flags);
  WlCuFileError (*bufDeregister)(const void* device_ptr);
  ssize_t (*read)(void* handle, void* device_base, size_t bytes, off_t file_offset, off_t device_offset);
  // Optional (null when the library lacks it).
  WlCuFileError (*driverGetProperties)(WlCuFileDrvProps* props);
};

// NCCL (libnccl.so.2): filled for the distributed component (collective.h).
struct WlNcclUniqueId {
  char internal[128];
};
struct WlNccl {
  int (*getVersion)(int* version);
  int (*getUniqueId)(WlNcclUniqueId* id);
  int (*commInitRank)(void** comm, int nranks, WlNcclUniqueId id, int rank);
  int (*commDestroy)(void* comm);
  int (*allGather)(const void* send, void* recv, size_t count, int datatype, void* comm, void* stream);
  int (*broadcast)(const void* send, void* recv, size_t count, int datatype, int root, void* comm, void* stream);
  const char* (*getErrorString)(int result);
  // A communicator the caller made (weightlift's distributed loading, src/dist/).
  int (*commCount)(void* comm, int* count);
  int (*commUserRank)(void* comm, int* rank);
  int (*commAbort)(void* comm);
  int (*commGetAsyncError)(void* comm, int* result);
};

// libweightlift_cuda.so (src/cuda/backend.cu): our kernels, plus the CUDA
// runtime it links statically, which serves when the process has no
// libcudart of its own.
struct WlCudaApi {
  int abi_version;
  WlCudaRuntime runtime;
  // Fills numel elements of `kind` (wl::dummy::Kind) at device pointer
  // `ptr` and waits for the kernel; a message goes to err (NUL-terminated).
  int (*fill_dummy)(int device, int kind, void* ptr, uint64_t numel, const wl::dummy::Params* params, char* err,
                    size_t errlen);
};

// The one symbol the loader looks up in libweightlift_cuda.so.
const WlCudaApi* wl_cuda_api(void);
}

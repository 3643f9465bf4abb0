// Private: GPUDirect Storage for one load (cuFile reads from a file straight
// into device memory). Files are registered on first use and kept registered
// (and open) while the load reads them, at most kMaxHandles at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/api.h"
#include "weightlift/io.h"

namespace wl::gpu {

class DirectReader {
 public:
  static constexpr size_t kMaxHandles = 64;
  DirectReader(Backend& backend, int device) : backend_(backend), device_(device) {}
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  // OK when GPU-direct reads of `probe` can serve a load under `policy`
  // (choose() weighs a refusal against the destination's wish): kAuto asks
  // the platform first (gds_platform.h; cuFile is not even opened where it
  // refuses), then cuFile's driver properties, both cached per device and
  // filesystem, then registers the file; kOn, or kAuto with `trust_cufile`
  // (WEIGHTLIFT_GDS_AUTO=cufile), asks cuFile alone (its driver open and the
  // file's registration). Else why not.
  Status support(const RandomAccessFile& probe, Toggle policy, bool trust_cufile);
  // Registers device memory that reads will land in (faster DMA); optional.
  void register_buffer(const std::byte* base, uint64_t n);
  // n bytes of `file` at `offset` into device memory at `dst`.
  Status read(const RandomAccessFile& file, uint64_t offset, std::byte* dst, uint64_t n);

 private:
  struct Handle {
    const WlCuFile* fn = nullptr;
    std::shared_ptr<const RandomAccessFile> file;  // keeps the descriptor open
    void* handle = nullptr;
    ~Handle();
  };
  Result<std::shared_ptr<Handle>> handle_of(const RandomAccessFile& file);
  // "" when the platform and cuFile's driver read `probe`'s filesystem GPU-direct; else why not.
  std::string verdict(const RandomAccessFile& probe);

  Backend& backend_;
  const int device_;
  std::mutex mu_;
  std::map<const RandomAccessFile*, std::shared_ptr<Handle>> handles_;
  std::vector<const RandomAccessFile*> order_;  // registration order, for eviction
  std::vector<std::pair<const std::byte*, uint64_t>> buffers_;
};

}  // namespace wl::gpu

// weightlift/tensor.h: host memory, tensor views and owned tensors.
//
// Ownership: a TensorView never owns bytes by itself; it holds a
// shared_ptr<const void> "owner" (a file mapping, a whole-file buffer, a
// Buffer) that keeps its bytes alive as long as the view or any copy of it
// lives. A Tensor owns a private, writable Buffer.
// Thread-safety: const methods are safe from many threads; a Tensor's bytes
// may be written by one thread at a time (or by disjoint ranges).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weightlift/device.h"
#include "weightlift/dtype.h"
#include "weightlift/status.h"

namespace wl {

using Shape = std::vector<int64_t>;

// What every tensor record (safetensors' TensorInfo, CheckpointTensor, the
// engine's TensorRequest and PlannedTensor) says about a tensor apart from
// where its bytes are: its name, dtype, shape and C-contiguous size.
struct TensorMeta {
  std::string name;
  DType dtype = DType::U8;
  Shape shape;
  uint64_t nbytes = 0;
};

// "[2, 3]".
std::string shape_to_string(std::span<const int64_t> shape);
// Element count; REQUIRES: the shape was validated (no overflow, no negatives).
uint64_t shape_numel(std::span<const int64_t> shape);

// Aligned heap memory. Large buffers (>= 2 MiB) come straight from mmap,
// 2 MiB-aligned and advised for transparent huge pages, which halves the
// page-fault cost of filling a fresh buffer. Move-only.
class Buffer {
 public:
  Buffer() = default;
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Allocation failure is an error, not an abort. `alignment` is a power of two.
  static Result<Buffer> allocate(size_t size, size_t alignment = 64);

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  // Faults in the pages wholly inside bytes [offset, offset+n), keeping their
  // contents, so that a later writer (a DMA, another process copying in)
  // finds them mapped. Pages the range only partly covers are left alone, so
  // other threads may write next to the range meanwhile. Best effort.
  void prefault(size_t offset, size_t n);

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // non-zero when the memory came from mmap
};

// A tensor's bytes wherever they live: host memory (the default) or device
// memory (device().kind == kCuda: bytes() is then a device address range,
// never to be dereferenced on the host).
class TensorView {
 public:
  TensorView() = default;
  TensorView(DType dtype, Shape shape, std::span<const std::byte> bytes, std::shared_ptr<const void> owner,
             Device device = {})
      : dtype_(dtype), shape_(std::move(shape)), bytes_(bytes), owner_(std::move(owner)), device_(device) {}

  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  uint64_t numel() const { return shape_numel(shape_); }
  std::span<const std::byte> bytes() const { return bytes_; }
  const std::byte* data() const { return bytes_.data(); }
  size_t nbytes() const { return bytes_.size(); }
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  DType dtype_ = DType::U8;
  Shape shape_;
  std::span<const std::byte> bytes_;
  std::shared_ptr<const void> owner_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled only where the OS gives zeroed pages; callers overwrite every byte.
  // Fails with kInvalidArgument on a bad shape, kOutOfRange when it cannot be allocated.
  static Result<Tensor> empty(DType dtype, Shape shape);
  // A private copy of a view's bytes.
  static Result<Tensor> copy_of(const TensorView& view);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  uint64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return buf_ ? buf_->size() : 0; }
  std::span<std::byte> mutable_bytes() { return buf_ ? buf_->span() : std::span<std::byte>(); }
  std::span<const std::byte> bytes() const {
    return buf_ ? std::span<const std::byte>(buf_->span()) : std::span<const std::byte>();
  }
  // A view that shares ownership of this tensor's buffer.
  TensorView view() const { return TensorView(dtype_, shape_, bytes(), buf_); }

 private:
  DType dtype_ = DType::U8;
  Shape shape_;
  std::shared_ptr<Buffer> buf_;
};

}  // namespace wl

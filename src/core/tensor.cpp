#include "weightlift/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/memory_admission.h"
#include "util/checked.h"

namespace wl {

namespace {
constexpr size_t kHugeThreshold = size_t{2} << 20;
constexpr size_t kHugePage = size_t{2} << 20;
// Allocations from this size on are admitted against the memory available
// (sizes often come from a file's or a server's claims).
constexpr size_t kAdmitThreshold = size_t{64} << 20;
}  // namespace

std::string shape_to_string(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

uint64_t shape_numel(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Buffer::~Buffer() {
  if (mapped_ != 0) {
    ::munmap(data_, mapped_);
  } else {
    std::free(data_);
  }
}

Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), size_(o.size_), mapped_(o.mapped_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.mapped_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    new (this) Buffer(std::move(o));
  }
  return *this;
}

void Buffer::prefault(size_t offset, size_t n) {
  if (offset > size_ || n > size_ - offset) return;
  const size_t page = 4096;
  const auto begin = (reinterpret_cast<uintptr_t>(data_) + offset + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data_) + offset + n) & ~(page - 1);
  if (end <= begin) return;
#ifdef MADV_POPULATE_WRITE
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) == 0) return;
#endif
  for (uintptr_t p = begin; p < end; p += page) {  // older kernels: touch each page, keeping its byte
    volatile std::byte* b = reinterpret_cast<std::byte*>(p);
    *b = *b;
  }
}

Result<Buffer> Buffer::allocate(size_t size, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    return Status::InvalidArgument(fmt::format("buffer alignment {} is not a power of two", alignment));
  Buffer b;
  b.size_ = size;
  if (size == 0) return b;
  if (size >= kAdmitThreshold) {  // before the allocation, never after (MAP_NORESERVE would let it fault in later)
    auto avail = memory_available_for_buffers();
    if (avail.ok() && size > *avail)
      return Status::OutOfRange(fmt::format(
          "cannot allocate {} bytes ({:.1f} GiB): more than the {} bytes ({:.1f} GiB) of memory available "
          "(MemAvailable, within the cgroup limit); nothing was allocated",
          size, static_cast<double>(size) / (1ull << 30), *avail, static_cast<double>(*avail) / (1ull << 30)));
  }
  if (size >= kHugeThreshold && alignment <= kHugePage) {
    // Map body + one huge page, then trim to a 2 MiB-aligned body.
    uint64_t body = 0, len = 0;
    if (!checked_add(size, kHugePage - 1, &body) || !checked_add(body & ~(kHugePage - 1), kHugePage, &len))
      return Status::OutOfRange(fmt::format("cannot allocate {} bytes", size));
    body &= ~(kHugePage - 1);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      return Status::OutOfRange(fmt::format("cannot allocate {} bytes: {}", size, std::strerror(errno)));
    // Trim to a 2 MiB-aligned start so huge pages can back it.
    auto addr = reinterpret_cast<uintptr_t>(p);
    uintptr_t aligned = (addr + kHugePage - 1) & ~(kHugePage - 1);
    size_t head = aligned - addr;
    if (head) ::munmap(p, head);
    size_t tail = len - head - body;
    if (tail) ::munmap(reinterpret_cast<void*>(aligned + body), tail);
    ::madvise(reinterpret_cast<void*>(aligned), body, MADV_HUGEPAGE);
    b.data_ = reinterpret_cast<std::byte*>(aligned);
    b.mapped_ = body;
    return b;
  }
  void* p = nullptr;
  if (::posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, size) != 0)
    return Status::OutOfRange(fmt::format("cannot allocate {} bytes", size));
  b.data_ = static_cast<std::byte*>(p);
  return b;
}

Result<Tensor> Tensor::empty(DType dtype, Shape shape) {
  uint64_t numel = 0;
  if (!checked_numel(shape, &numel))
    return Status::InvalidArgument(fmt::format("invalid shape {}", shape_to_string(shape)));
  auto nbytes = dtype_nbytes(dtype, numel);
  if (!nbytes)
    return Status::InvalidArgument(
        fmt::format("shape {} of {} is not a whole number of bytes", shape_to_string(shape), dtype_name(dtype)));
  WL_ASSIGN_OR_RETURN(Buffer buf, Buffer::allocate(*nbytes));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.buf_ = std::make_shared<Buffer>(std::move(buf));
  return t;
}

Result<Tensor> Tensor::copy_of(const TensorView& view) {
  WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(view.dtype(), view.shape()));
  if (t.nbytes() != view.nbytes())
    return Status::Internal(fmt::format("view holds {} bytes, its shape needs {}", view.nbytes(), t.nbytes()));
  if (view.nbytes()) std::memcpy(t.mutable_bytes().data(), view.data(), view.nbytes());
  return t;
}

}  // namespace wl

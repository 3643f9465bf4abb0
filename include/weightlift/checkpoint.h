// weightlift/checkpoint.h: one reader interface over every weight-file format
// (safetensors, PyTorch .bin/.pt, NumPy .npy), so that `ls`, `load`, the
// engine and the Python package treat them alike.
//
// Thread-safety: a CheckpointReader is immutable after open; read() and
// view() may be called from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

struct CheckpointTensor : TensorMeta {  // nbytes: the logical C-contiguous size
  // Where the bytes lie in the file when they are stored contiguously in
  // row-major order (safetensors always; PyTorch when the view is contiguous).
  std::optional<uint64_t> file_offset;
};

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  virtual const std::string& path() const = 0;
  virtual std::string_view format_name() const = 0;  // "safetensors", "pytorch", "numpy"
  // The version of the file the header was read from (RandomAccessFile::version()).
  virtual std::string version() const = 0;
  // In file order.
  virtual const std::vector<CheckpointTensor>& tensors() const = 0;
  // The tensor's logical C-contiguous row-major bytes, zero-copy when the
  // storage is contiguous and mapped, else a private copy.
  virtual Result<TensorView> view(size_t index) const = 0;
  // Always a private, owned copy.
  virtual Result<Tensor> read(size_t index) const = 0;
};

// Opens any supported weight file; the format comes from the extension
// (.safetensors, .bin/.pt/.pth, .npy) or, failing that, the magic bytes.
Result<std::unique_ptr<CheckpointReader>> open_checkpoint(const std::string& path, Env* env = Env::Default());

// Format-specific openers (each in its own component).
Result<std::unique_ptr<CheckpointReader>> open_safetensors_checkpoint(const std::string& path, Env* env);
Result<std::unique_ptr<CheckpointReader>> open_pytorch_checkpoint(const std::string& path, Env* env);
Result<std::unique_ptr<CheckpointReader>> open_numpy_checkpoint(const std::string& path, Env* env);

}  // namespace wl

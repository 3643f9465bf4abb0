// weightlift/format.h: what a weight-file format implements. A format reads
// its files through a CheckpointReader, and describes itself in a
// CheckpointFormat record (its name, file name endings, magic bytes and
// opener), declared in its own header (safetensors.h, torch.h, npy.h). The
// registry that lists the records and picks one for a file, open_checkpoint(),
// stands above the formats (checkpoint.h): a format never calls it.
//
// Thread-safety: a CheckpointReader is immutable after open; read() and
// view() may be called from many threads. Records are immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/dtype.h"
#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

enum class WeightFormat { kSafetensors, kPytorch, kNumpy };

struct CheckpointTensor : TensorMeta {  // nbytes: the logical C-contiguous size
  // Where the bytes lie in the file when they are stored contiguously in
  // row-major order (safetensors always; PyTorch when the view is contiguous).
  std::optional<uint64_t> file_offset;
};

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;
  virtual const std::string& path() const = 0;
  virtual std::string_view format_name() const = 0;  // its format's CheckpointFormat::name
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

using OpenCheckpointFn = Result<std::unique_ptr<CheckpointReader>> (*)(const std::string& path, Env* env);

// One format, as the registry lists it.
struct CheckpointFormat {
  WeightFormat id;
  std::string_view name;                         // "safetensors", "pytorch", "numpy": its readers' format_name()
  std::span<const std::string_view> extensions;  // file name endings that mean it (".bin"), compared exactly
  std::span<const std::string_view> magics;      // a file that starts with one of these is of it; none: empty
  OpenCheckpointFn open;                         // errors name the file

  // `path` ends with one of the extensions.
  bool claims_name(std::string_view path) const;
  // `head` (the first bytes of a file) starts with one of the magics.
  bool claims_head(std::span<const std::byte> head) const;
};

}  // namespace wl

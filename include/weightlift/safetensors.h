// weightlift/safetensors.h: the safetensors format, read and written.
//
// The reader is strict exactly where Hugging Face's Rust implementation is:
//   - 8-byte little-endian header length N, N <= 100,000,000 and 8 + N <= file size,
//     checked before anything is allocated;
//   - the header is UTF-8 JSON, an object starting with '{' (trailing spaces allowed);
//   - each entry: a known dtype, a shape of non-negative integers whose element
//     count does not overflow, data_offsets [begin, end] with begin <= end and
//     end - begin == bytes of (numel x dtype);
//   - tensors tile the data area in offset order, no gap, no overlap, and end
//     exactly at the end of the file;
//   - "__metadata__" is a string-to-string map; duplicate names are rejected.
// and one step stricter, so that no file means one thing here and another
// there: a key repeated anywhere in the header is refused (a tensor name,
// "__metadata__", a field of an entry, known or not, a key inside
// "__metadata__"), where safetensors refuses a repeated field or
// "__metadata__" and keeps the last of a repeated tensor name or metadata key.
// Every error names the file and, where it applies, the tensor.
//
// Thread-safety: a SafetensorsFile is immutable after open(); every const
// method may be called from many threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weightlift/dtype.h"
#include "weightlift/format.h"
#include "weightlift/io.h"
#include "weightlift/status.h"
#include "weightlift/tensor.h"

namespace wl {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct TensorInfo : TensorMeta {
  uint64_t offset = 0;  // absolute byte offset in the file (8 + N + data_offsets[0])
};

// The parsed header of one file.
struct SafetensorsHeader {
  uint64_t header_size = 0;         // N
  uint64_t data_start = 0;          // 8 + N
  std::vector<TensorInfo> tensors;  // in file (offset) order
  std::map<std::string, std::string> metadata;
};

// Validates a header against the file's total size. `json` is the N header
// bytes (without the 8-byte length). `file` only names errors.
Result<SafetensorsHeader> parse_safetensors_header(std::string_view json, uint64_t file_size,
                                                   std::string_view file = {});
// Reads the length prefix and header of an open file, then parses it.
Result<SafetensorsHeader> read_safetensors_header(const RandomAccessFile& file);

// `mode` says how the tensors' bytes are reached (io.h's FileMode):
//   kMmap, kMmapPrivate  lazy: the file mapped; views are zero-copy into the mapping
//   kPread, kDirect      eager: the whole file read into one buffer with one
//                        read; views point into it
class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path, FileMode mode = FileMode::kMmap,
                                                       Env* env = Env::Default());
  // Over an already-open file (a mapped mode needs view() support, else bytes
  // are read on demand; a read mode reads it whole).
  static Result<std::shared_ptr<SafetensorsFile>> open(std::shared_ptr<RandomAccessFile> file,
                                                       FileMode mode = FileMode::kMmap);

  const std::string& path() const { return file_->path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  std::vector<std::string> names() const;  // sorted, as safe_open.keys()
  const TensorInfo* find(std::string_view name) const;
  const std::shared_ptr<RandomAccessFile>& file() const { return file_; }
  uint64_t file_size() const { return file_->size(); }

  // A view of a tensor's bytes that keeps the mapping / buffer alive. For a
  // file that cannot be mapped, the bytes are read into a private buffer.
  Result<TensorView> get(std::string_view name) const;
  // An owned copy (pread straight into a fresh buffer; never a view).
  Result<Tensor> read(std::string_view name) const;
  // [begin, end) along `dim` (negative counts from the end), reading only
  // those bytes (one range for dim 0, coalesced runs for the others; the
  // layout is shard.h's slice_layout). 0-dim tensors cannot be sliced
  // (kInvalidArgument); begin and end are clamped to the dim, as Python slicing does.
  Result<Tensor> read_slice(std::string_view name, int dim, int64_t begin, int64_t end) const;

 private:
  SafetensorsFile() = default;
  std::shared_ptr<RandomAccessFile> file_;
  std::shared_ptr<Buffer> eager_;  // a read mode: the whole file
  SafetensorsHeader header_;
  std::unordered_map<std::string_view, size_t> by_name_;  // into header_.tensors
};

// One tensor to write: a name and its bytes (contiguous, row-major).
struct NamedTensor {
  std::string name;
  TensorView view;
};

// The header bytes (length prefix included) that Hugging Face's writer emits
// for these tensors, and the order in which their data follows. Tensors are
// ordered by dtype (descending, in the order of safetensors' Dtype enum:
// larger alignment first), then by name; the JSON is compact,
// "__metadata__" comes first, and the header is padded with spaces to 8 bytes.
struct SafetensorsLayout {
  std::string prefix;           // 8-byte length + header
  std::vector<size_t> order;    // indices into the input, in data order
  std::vector<uint64_t> begin;  // data_offsets[0] per input index
  uint64_t total_size = 0;      // prefix + all data
};
Result<SafetensorsLayout> plan_safetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata = {});

// Writes a file atomically (temporary + rename). Names must be unique; dtypes
// must be storable in safetensors; each view's size must match its shape.
// sync: fsync before the rename (AtomicFile::commit); false is safetensors'
// own save_file behaviour (atomic for readers, not durable across a crash).
Status write_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata = {}, Env* env = Env::Default(),
                         bool sync = true);
// The same bytes, in memory.
Result<std::string> serialize_safetensors(std::span<const NamedTensor> tensors,
                                          const std::map<std::string, std::string>& metadata = {});

// ---- as a weight-file format (format.h) -----------------------------------------

// The format's record: ".safetensors", no magic (the file starts with its
// header's length); the registry (checkpoint.h) reads a file that no format
// claims as safetensors.
const CheckpointFormat& safetensors_format();
// A CheckpointReader over SafetensorsFile::open(path, kMmap, env).
Result<std::unique_ptr<CheckpointReader>> open_safetensors_checkpoint(const std::string& path, Env* env);

}  // namespace wl

// weightlift/torch.h: PyTorch checkpoints (torch.save), read without Python or libtorch.
//
// Both formats torch.save has written: the zip archive (PyTorch >= 1.6,
// zip64 included) and the legacy stream (`_use_new_zipfile_serialization=False`).
// data.pkl is decoded by a restricted unpickler that accepts exactly the
// globals of PyTorch's weights-only unpickler (rebuild functions, storage and
// tensor classes, dtypes, OrderedDict, torch.Size, Parameter); anything else is
// refused with an error naming the global. Nothing is ever executed.
//
// Tensors are exposed two ways:
//   - as a CheckpointReader: view() gives the logical C-contiguous bytes
//     (zero-copy into the file mapping when the tensor is contiguous, a
//     private copy otherwise; big-endian files are byte-swapped into a copy);
//   - strided, as PyTorch sees them: a storage (shared by every tensor that
//     uses it), an element offset, sizes and strides.
// Names: a state dict's keys; nested dicts/lists are flattened with "."
// (e.g. {"model": {"w": t}} lists "model.w"); non-tensor values are skipped.
//
// Thread-safety: a TorchCheckpoint is immutable after open(); every const
// method may be called from many threads. Views keep the file mapping alive.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "weightlift/format.h"

namespace wl {

// One storage record (`data/<key>` in a zip, a raw block in the legacy format).
struct TorchStorage {
  std::string key;
  DType dtype = DType::U8;   // element type of the storage class
  uint64_t numel = 0;        // elements, as declared in the pickle
  uint64_t nbytes = 0;       // numel x element size (validated against the record)
  uint64_t file_offset = 0;  // absolute offset of the bytes in the file
};

// A tensor as PyTorch rebuilds it: elements storage[offset + sum(i_k * strides[k])].
struct TorchTensor {
  std::string name;
  DType dtype = DType::U8;
  Shape sizes;
  std::vector<int64_t> strides;  // in elements; validated non-negative, in-bounds
  uint64_t storage_offset = 0;   // in elements
  size_t storage = 0;            // index into storages(); equal index = shared storage
  bool contiguous = false;       // row-major contiguous (the bytes are one run in the file)
  bool requires_grad = false;
  bool is_parameter = false;
};

struct TorchOpenOptions {
  // As the reference's conversion does: when the top-level object is a dict
  // with a "state_dict" key, list only the tensors under it (without prefix).
  bool unwrap_state_dict = false;
  // Pre-fault the whole mapping at open (MAP_POPULATE): one batched kernel pass
  // instead of a page fault per page when every tensor will be touched.
  bool populate = false;
};

class TorchCheckpoint final : public CheckpointReader {
 public:
  // Maps the file (Env kMmap; falls back to reads where the Env cannot map).
  // Errors name the file and, where it applies, the tensor or the refused global.
  static Result<std::shared_ptr<TorchCheckpoint>> open(const std::string& path, Env* env = Env::Default(),
                                                       const TorchOpenOptions& options = {});

  const std::string& path() const override { return path_; }
  std::string version() const override { return file_->version(); }
  std::string_view format_name() const override { return "pytorch"; }
  const std::vector<CheckpointTensor>& tensors() const override { return infos_; }
  Result<TensorView> view(size_t index) const override;
  Result<Tensor> read(size_t index) const override;

  const std::vector<TorchTensor>& strided() const { return strided_; }
  const std::vector<TorchStorage>& storages() const { return storages_; }
  // A storage's raw bytes in file byte order (zero-copy when mapped; the owner keeps them alive).
  Result<TensorView> storage_bytes(size_t storage) const;
  bool big_endian() const { return big_endian_; }
  bool legacy_format() const { return legacy_; }
  // open() with unwrap_state_dict found a top-level "state_dict" entry and listed only its tensors.
  bool unwrapped_state_dict() const { return unwrapped_state_dict_; }

  // Internal: built by the parser.
  TorchCheckpoint() = default;
  std::string path_;
  std::shared_ptr<RandomAccessFile> file_;
  std::vector<CheckpointTensor> infos_;
  std::vector<TorchTensor> strided_;
  std::vector<TorchStorage> storages_;
  bool big_endian_ = false;
  bool legacy_ = false;
  bool unwrapped_state_dict_ = false;
};

// The format's record: ".bin", ".pt", ".pth"; the magic "PK" (a zip archive)
// or 0x80 (the legacy stream starts with a pickle's PROTO opcode).
const CheckpointFormat& pytorch_format();
// A CheckpointReader over TorchCheckpoint::open(path, env).
Result<std::unique_ptr<CheckpointReader>> open_pytorch_checkpoint(const std::string& path, Env* env);

}  // namespace wl

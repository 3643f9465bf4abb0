// weightlift/convert.h: PyTorch .bin/.pt checkpoints to safetensors, as the
// reference's convert_bin_to_safetensor_file does, without Python:
//   - a top-level "state_dict" entry is unwrapped;
//   - of tensors that start at the same byte of the same storage (tied
//     weights: the reference keys on data_ptr()), only the first name is kept;
//   - every tensor is written contiguous (strided views are gathered);
//   - the output is refused when it would be more than 1% larger than the input;
//   - every tensor is read back from the written file and compared byte for
//     byte BEFORE the file takes its final name (temporary + rename), so a
//     failed conversion never leaves a file under the output name.
// Metadata {"format": "pt"} is written, as the reference does.
//
// Thread-safety: the functions are reentrant; they use one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl {

struct ConvertOptions {
  bool verify = true;             // read every tensor back and compare bytes
  double max_size_growth = 0.01;  // refuse an output larger than input x (1 + this)
};

struct ConvertResult {
  std::vector<std::string> outputs;  // safetensors files written (and the index, for a folder)
  uint64_t tensors = 0;              // tensors written
  std::vector<std::string> dropped;  // names dropped because they share storage with an earlier one
  uint64_t input_bytes = 0;
  uint64_t output_bytes = 0;
};

// One file. The output's parent folder is created when missing.
Result<ConvertResult> convert_pytorch_to_safetensors(const std::string& input, const std::string& output,
                                                     const ConvertOptions& options = {}, Env* env = Env::Default());

// A model folder holding pytorch_model*.bin (or *.pt): each shard becomes a
// safetensors file in `output_folder` ("pytorch_model" -> "model", extension
// ".safetensors") and model.safetensors.index.json maps every tensor to its
// shard (metadata.total_size = bytes of all tensors). `output_folder` may be
// the input folder.
Result<ConvertResult> convert_pytorch_folder(const std::string& folder, const std::string& output_folder,
                                             const ConvertOptions& options = {}, Env* env = Env::Default());

// The output name of one shard: "pytorch_model-00001-of-00002.bin" -> "model-00001-of-00002.safetensors".
std::string safetensors_name_for(const std::string& pytorch_file_name);

}  // namespace wl

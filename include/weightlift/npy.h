// weightlift/npy.h: NumPy .npy files (format versions 1.0, 2.0 and 3.0) and
// the reference's NumPy weight cache.
//
// Reading accepts C and Fortran order and either byte order; view() of a
// little-endian C-order file is zero-copy, anything else becomes a private
// row-major little-endian copy. Writing produces version 1.0 (2.0 when the
// header needs it), C order, little-endian, 64-byte aligned data, atomically.
// Element types: bool, int8..64, uint8..64, float16/32/64, complex64/128
// (NumPy has no bfloat16 or float8: such tensors are refused by write_npy).
//
// The cache (what the reference's np_cache_weights_iterator does): a folder
// `np/` beside the weights, one .npy file per tensor named exactly like the
// tensor (no extension), and `np/weight_names.json` listing the names in
// order. It is dumped once, under an exclusive lock, by the first process;
// the others wait and read it back.
//
// Thread-safety: free functions are reentrant; NpyHeader is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/checkpoint.h"
#include "weightlift/tensor.h"

namespace wl {

struct NpyHeader {
  int major = 1;
  int minor = 0;
  DType dtype = DType::U8;
  bool big_endian = false;
  bool fortran_order = false;
  Shape shape;
  uint64_t data_offset = 0;  // bytes from the start of the file
  uint64_t nbytes = 0;       // numel x element size; data_offset + nbytes <= file size
};

// Parses the magic, version, header length and header dict of `head` (the
// first bytes of a file of `file_size` bytes). `file` only names errors.
Result<NpyHeader> parse_npy_header(std::string_view head, uint64_t file_size, std::string_view file = {});
Result<NpyHeader> read_npy_header(const RandomAccessFile& file);

// The whole array as a row-major, little-endian tensor.
Result<Tensor> read_npy(const std::string& path, Env* env = Env::Default());
// Writes `t` (row-major bytes) atomically.
Status write_npy(const std::string& path, const TensorView& t, Env* env = Env::Default());
// The same bytes in memory.
Result<std::string> serialize_npy(const TensorView& t);

// ---- the NumPy weight cache ----------------------------------------------------

inline constexpr std::string_view kNpCacheFolder = "np";
inline constexpr std::string_view kNpCacheNames = "weight_names.json";

struct NpCacheResult {
  std::string np_folder;
  std::vector<std::string> names;  // in dump order
  bool dumped = false;             // this call wrote the cache (false: it was there already)
};

// Ensures `<hf_folder>/np/` holds the tensors of `weight_files` (PyTorch
// .bin/.pt or safetensors): under an exclusive lock on `lock_path` (default
// `<hf_folder>/np.lock`), dumps every tensor unless weight_names.json exists.
// A tensor name that is not a plain file name ("/", "..", empty) is refused.
Result<NpCacheResult> np_cache_prepare(const std::vector<std::string>& weight_files, const std::string& hf_folder,
                                       const std::string& lock_path = {}, Env* env = Env::Default());

// Reads weight_names.json of a prepared cache (names in order).
Result<std::vector<std::string>> np_cache_names(const std::string& hf_folder);
// One cached tensor.
Result<Tensor> np_cache_read(const std::string& hf_folder, const std::string& name, Env* env = Env::Default());

}  // namespace wl

// weightlift/npy.h: NumPy .npy files (format versions 1.0, 2.0 and 3.0); the
// reference's NumPy weight cache, which dumps any checkpoint into them, is
// np_cache.h's.
//
// Reading accepts C and Fortran order and either byte order; view() of a
// little-endian C-order file is zero-copy, anything else becomes a private
// row-major little-endian copy. Writing produces version 1.0 (2.0 when the
// header needs it), C order, little-endian, 64-byte aligned data, atomically.
// Element types: bool, int8..64, uint8..64, float16/32/64, complex64/128
// (NumPy has no bfloat16 or float8: such tensors are refused by write_npy).
//
// Thread-safety: free functions are reentrant; NpyHeader is a value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/format.h"
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

// ---- as a weight-file format (format.h) -----------------------------------------

// The format's record: ".npy"; the magic 0x93 'N' (of "\x93NUMPY").
const CheckpointFormat& numpy_format();
// A CheckpointReader over one .npy file: one tensor, named as the file without ".npy".
Result<std::unique_ptr<CheckpointReader>> open_numpy_checkpoint(const std::string& path, Env* env);

}  // namespace wl

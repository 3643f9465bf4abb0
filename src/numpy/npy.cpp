// NumPy .npy files: header parsing, reading (any order, either endianness), writing.
#include "weightlift/npy.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "torch/strided_copy.h"
#include "util/checked.h"

namespace wl {
namespace {

constexpr uint64_t kMaxHeader = 1 << 20;  // NumPy itself refuses headers over 10000 bytes by default

struct Descr {
  char kind;
  int size;
  DType dtype;
};
const Descr kDescrs[] = {
    {'b', 1, DType::BOOL}, {'i', 1, DType::I8},  {'i', 2, DType::I16}, {'i', 4, DType::I32},   {'i', 8, DType::I64},
    {'u', 1, DType::U8},   {'u', 2, DType::U16}, {'u', 4, DType::U32}, {'u', 8, DType::U64},   {'f', 2, DType::F16},
    {'f', 4, DType::F32},  {'f', 8, DType::F64}, {'c', 8, DType::C64}, {'c', 16, DType::C128},
};

size_t swap_unit(DType t) {
  if (t == DType::C64) return 4;
  if (t == DType::C128) return 8;
  return static_cast<size_t>(dtype_size(t));
}

// A tiny parser for the header's Python dict literal.
class Lit {
 public:
  explicit Lit(std::string_view s) : s_(s) {}
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool str(std::string* out) {
    ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return false;
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) return false;
    *out = std::string(s_.substr(i_, end - i_));
    i_ = end + 1;
    return true;
  }
  bool word(std::string_view w) {
    ws();
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool integer(int64_t* out) {
    ws();
    size_t start = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (s_[i_++] - '0');
    }
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 longs
    *out = v;
    return i_ > start;
  }
  bool at_end() {
    ws();
    return i_ == s_.size();
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

Status corrupt(std::string_view file, std::string what) { return Status::Corrupt("npy: " + what).with_file(file); }

}  // namespace

Result<NpyHeader> parse_npy_header(std::string_view head, uint64_t file_size, std::string_view file) {
  if (head.size() < 10 || head.substr(0, 6) != "\x93NUMPY") return corrupt(file, "missing the \\x93NUMPY magic");
  NpyHeader h;
  h.major = static_cast<unsigned char>(head[6]);
  h.minor = static_cast<unsigned char>(head[7]);
  uint64_t hlen = 0, prefix = 0;
  auto b = [&](size_t k) { return uint64_t{static_cast<unsigned char>(head[k])}; };
  if (h.major == 1) {
    hlen = b(8) | (b(9) << 8);
    prefix = 10;
  } else if (h.major == 2 || h.major == 3) {
    if (head.size() < 12) return corrupt(file, "truncated header");
    hlen = b(8) | (b(9) << 8) | (b(10) << 16) | (b(11) << 24);
    prefix = 12;
  } else {
    return Status::Unimplemented(fmt::format("npy: format version {}.{} is not supported", h.major, h.minor))
        .with_file(file);
  }
  if (hlen > kMaxHeader) return corrupt(file, fmt::format("header of {} bytes is too large", hlen));
  if (prefix + hlen > head.size() || prefix + hlen > file_size)
    return corrupt(file, fmt::format("header of {} bytes runs past the end of the file", hlen));
  std::string_view dict = head.substr(prefix, hlen);
  Lit p(dict);
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false;
  if (!p.eat('{')) return corrupt(file, "header is not a dict literal");
  while (!p.eat('}')) {
    std::string key;
    if (!p.str(&key) || !p.eat(':')) return corrupt(file, "malformed header dict");
    if (key == "descr") {
      if (!p.str(&descr)) return Status::Unimplemented("npy: structured dtypes are not supported").with_file(file);
      have_descr = true;
    } else if (key == "fortran_order") {
      if (p.word("True"))
        h.fortran_order = true;
      else if (p.word("False"))
        h.fortran_order = false;
      else
        return corrupt(file, "fortran_order is not True or False");
      have_order = true;
    } else if (key == "shape") {
      if (!p.eat('(')) return corrupt(file, "shape is not a tuple");
      while (!p.eat(')')) {
        int64_t d = 0;
        if (!p.integer(&d)) return corrupt(file, "shape holds a non-integer");
        if (h.shape.size() >= 64) return corrupt(file, "shape has too many dimensions");
        h.shape.push_back(d);
        if (!p.eat(',')) {
          if (!p.eat(')')) return corrupt(file, "malformed shape tuple");
          break;
        }
      }
      have_shape = true;
    } else {
      return corrupt(file, fmt::format("unexpected header key '{}'", key));
    }
    if (!p.eat(',')) {
      if (!p.eat('}')) return corrupt(file, "malformed header dict");
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) return corrupt(file, "header lacks descr, fortran_order or shape");
  if (descr.size() < 3) return corrupt(file, fmt::format("unknown dtype '{}'", descr));
  char order = descr[0];
  if (order != '<' && order != '>' && order != '|' && order != '=')
    return corrupt(file, fmt::format("unknown byte order in dtype '{}'", descr));
  char kind = descr[1];
  int size = 0;
  for (size_t k = 2; k < descr.size(); ++k) {
    if (descr[k] < '0' || descr[k] > '9' || size > 1000)
      return Status::Unimplemented(fmt::format("npy: dtype '{}' is not supported", descr)).with_file(file);
    size = size * 10 + (descr[k] - '0');
  }
  bool found = false;
  for (auto& d : kDescrs) {
    if (d.kind == kind && d.size == size) {
      h.dtype = d.dtype;
      found = true;
    }
  }
  if (!found) return Status::Unimplemented(fmt::format("npy: dtype '{}' is not supported", descr)).with_file(file);
  h.big_endian = order == '>' && size > 1;
  uint64_t numel = 0;
  if (!checked_numel(h.shape, &numel) || !checked_mul(numel, static_cast<uint64_t>(size), &h.nbytes))
    return corrupt(file, fmt::format("shape {} overflows", shape_to_string(h.shape)));
  h.data_offset = prefix + hlen;
  if (h.nbytes > file_size - h.data_offset)
    return corrupt(file, fmt::format("array of shape {} needs {} bytes but the file holds {} after the header "
                                     "(truncated?)",
                                     shape_to_string(h.shape), h.nbytes, file_size - h.data_offset));
  return h;
}

Result<NpyHeader> read_npy_header(const RandomAccessFile& f) {
  uint64_t n = std::min<uint64_t>(f.size(), 12);
  std::string head(n, '\0');
  WL_RETURN_IF_ERROR(f.read_at(0, std::as_writable_bytes(std::span(head.data(), head.size()))));
  if (n < 10 || head.substr(0, 6) != "\x93NUMPY") return corrupt(f.path(), "missing the \\x93NUMPY magic");
  uint64_t hlen =
      static_cast<unsigned char>(head[8]) | (static_cast<unsigned>(static_cast<unsigned char>(head[9])) << 8);
  uint64_t prefix = 10;
  if (head[6] != 1 && n >= 12) {
    hlen |=
        (uint64_t{static_cast<unsigned char>(head[10])} << 16) | (uint64_t{static_cast<unsigned char>(head[11])} << 24);
    prefix = 12;
  }
  uint64_t want = std::min<uint64_t>(f.size(), prefix + std::min(hlen, kMaxHeader + 1));
  head.resize(want);
  WL_RETURN_IF_ERROR(f.read_at(0, std::as_writable_bytes(std::span(head.data(), head.size()))));
  return parse_npy_header(head, f.size(), f.path());
}

namespace {

// Row-major little-endian bytes of an array: a read, a gather for Fortran order, a swap for big-endian.
Status materialize(const RandomAccessFile& f, const NpyHeader& h, std::span<std::byte> dst) {
  if (h.nbytes == 0) return Status();
  if (!h.fortran_order || h.shape.size() < 2) {
    WL_RETURN_IF_ERROR(f.read_at(h.data_offset, dst));
  } else {
    Buffer raw;
    WL_ASSIGN_OR_RETURN(raw, Buffer::allocate(h.nbytes));
    WL_RETURN_IF_ERROR(f.read_at(h.data_offset, raw.span()));
    std::vector<int64_t> strides(h.shape.size());
    int64_t s = 1;
    for (size_t k = 0; k < h.shape.size(); ++k) {
      strides[k] = s;
      s *= h.shape[k];
    }
    strided_copy(raw.data(), static_cast<size_t>(dtype_size(h.dtype)), 0, h.shape, strides, dst.data());
  }
  if (h.big_endian) {
    size_t u = swap_unit(h.dtype);
    for (size_t i = 0; i + u <= dst.size(); i += u)
      std::reverse(dst.begin() + static_cast<ptrdiff_t>(i), dst.begin() + static_cast<ptrdiff_t>(i + u));
  }
  return Status();
}

class NpyCheckpoint final : public CheckpointReader {
 public:
  NpyCheckpoint(std::shared_ptr<RandomAccessFile> f, NpyHeader h) : f_(std::move(f)), h_(std::move(h)) {
    std::string base = std::filesystem::path(f_->path()).filename().string();
    if (base.size() > 4 && base.ends_with(".npy")) base.resize(base.size() - 4);
    CheckpointTensor t{{base, h_.dtype, h_.shape, h_.nbytes}};
    if (direct()) t.file_offset = h_.data_offset;
    tensors_.push_back(std::move(t));
  }
  const std::string& path() const override { return f_->path(); }
  std::string version() const override { return f_->version(); }
  std::string_view format_name() const override { return "numpy"; }
  const std::vector<CheckpointTensor>& tensors() const override { return tensors_; }
  Result<TensorView> view(size_t i) const override {
    if (i != 0) return Status::OutOfRange("tensor index out of range").with_file(path());
    if (direct()) {
      auto v = f_->view(h_.data_offset, h_.nbytes);
      if (v.ok()) return TensorView(h_.dtype, h_.shape, *v, f_);
    }
    WL_ASSIGN_OR_RETURN(Tensor t, read(0));
    return t.view();
  }
  Result<Tensor> read(size_t i) const override {
    if (i != 0) return Status::OutOfRange("tensor index out of range").with_file(path());
    WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(h_.dtype, h_.shape));
    WL_RETURN_IF_ERROR(materialize(*f_, h_, t.mutable_bytes()));
    return t;
  }

 private:
  bool direct() const { return !h_.big_endian && (!h_.fortran_order || h_.shape.size() < 2); }
  std::shared_ptr<RandomAccessFile> f_;
  NpyHeader h_;
  std::vector<CheckpointTensor> tensors_;
};

const char* descr_of(DType t) {
  switch (t) {
    case DType::BOOL: return "|b1";
    case DType::I8: return "|i1";
    case DType::U8: return "|u1";
    case DType::I16: return "<i2";
    case DType::U16: return "<u2";
    case DType::I32: return "<i4";
    case DType::U32: return "<u4";
    case DType::I64: return "<i8";
    case DType::U64: return "<u8";
    case DType::F16: return "<f2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::C64: return "<c8";
    case DType::C128: return "<c16";
    default: return nullptr;
  }
}

}  // namespace

Result<std::unique_ptr<CheckpointReader>> open_numpy_checkpoint(const std::string& path, Env* env) {
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, {.mode = FileMode::kMmap}), .file = path);
  WL_ASSIGN_OR_RETURN(NpyHeader h, read_npy_header(*f));
  return std::unique_ptr<CheckpointReader>(std::make_unique<NpyCheckpoint>(f, std::move(h)));
}

const CheckpointFormat& numpy_format() {
  static constexpr std::string_view kExtensions[] = {".npy"};
  static constexpr std::string_view kMagics[] = {"\x93N"};
  static const CheckpointFormat kFormat{WeightFormat::kNumpy, "numpy", kExtensions, kMagics, &open_numpy_checkpoint};
  return kFormat;
}

Result<Tensor> read_npy(const std::string& path, Env* env) {
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, {.mode = FileMode::kPread}), .file = path);
  WL_ASSIGN_OR_RETURN(NpyHeader h, read_npy_header(*f));
  WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(h.dtype, h.shape));
  WL_RETURN_IF_ERROR(materialize(*f, h, t.mutable_bytes()));
  return t;
}

Result<std::string> serialize_npy(const TensorView& t) {
  const char* descr = descr_of(t.dtype());
  if (!descr)
    return Status::Unimplemented(fmt::format("NumPy has no {} dtype; cannot write it to .npy", dtype_name(t.dtype())));
  std::string shape;
  for (size_t k = 0; k < t.shape().size(); ++k) shape += fmt::format("{}, ", t.shape()[k]);
  if (t.shape().size() > 1)
    shape.resize(shape.size() - 2);
  else if (t.shape().size() == 1)
    shape.pop_back();
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  // Pad with spaces and a final newline so that the data starts on a 64-byte boundary.
  size_t prefix = dict.size() + 1 + 10 > 65535 ? 12 : 10;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += prefix == 10 ? '\x01' : '\x02';
  out += '\0';
  uint64_t hl = dict.size();
  out += static_cast<char>(hl & 0xff);
  out += static_cast<char>((hl >> 8) & 0xff);
  if (prefix == 12) {
    out += static_cast<char>((hl >> 16) & 0xff);
    out += static_cast<char>((hl >> 24) & 0xff);
  }
  out += dict;
  out.append(reinterpret_cast<const char*>(t.data()), t.nbytes());
  return out;
}

Status write_npy(const std::string& path, const TensorView& t, Env* env) {
  const char* descr = descr_of(t.dtype());
  if (!descr)
    return Status::Unimplemented(fmt::format("NumPy has no {} dtype; cannot write it to .npy", dtype_name(t.dtype())))
        .with_file(path);
  // The header alone (no data), then the data appended straight from the view.
  WL_ASSIGN_OR_RETURN(std::string head, serialize_npy(TensorView(t.dtype(), t.shape(), {}, nullptr)));
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path, 0644, env));
  WL_RETURN_IF_ERROR(out.append(head));
  WL_RETURN_IF_ERROR(out.append(t.bytes()));
  return out.commit();
}

}  // namespace wl

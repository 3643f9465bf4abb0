#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/checked.h"
#include "util/utf8.h"
#include "weightlift/safetensors.h"

#include "weightlift/shard.h"

namespace wl {

namespace {

using json = nlohmann::json;

Status corrupt(std::string_view file, std::string msg) { return Status::Corrupt(std::move(msg)).with_file(file); }
Status corrupt_tensor(std::string_view file, std::string_view tensor, std::string msg) {
  return Status::Corrupt(std::move(msg)).with_file(file).with_tensor(tensor);
}

uint64_t load_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

// One header entry as read, before its rules are checked (by either parser).
struct EntryList {
  bool present = false, is_array = false, all_unsigned = true;
  std::vector<uint64_t> values;   // while every element is an unsigned integer
  std::vector<std::string> text;  // after one is not: every element as JSON, for the error message
  void not_unsigned() {
    if (!all_unsigned) return;
    all_unsigned = false;
    for (uint64_t v : values) text.push_back(std::to_string(v));
  }
  void clear() {  // keeps the capacity: no allocation per entry
    present = is_array = false;
    all_unsigned = true;
    values.clear();
    text.clear();
  }
};
struct Entry {
  std::string dtype;
  bool dtype_ok = false;  // present and a string
  EntryList shape, offsets;
  void clear() {
    dtype_ok = false;
    shape.clear();
    offsets.clear();
  }
};

// Checks one entry's rules and appends its tensor (offset relative to the data area).
Status add_entry(SafetensorsHeader& h, std::string_view file, const std::string& name, const Entry& entry) {
  if (!entry.dtype_ok) return corrupt_tensor(file, name, "missing or non-string dtype");
  auto parsed = dtype_from_name(entry.dtype);
  if (!parsed || !dtype_in_safetensors(*parsed))
    return corrupt_tensor(file, name, fmt::format("unknown dtype '{}'", entry.dtype));
  TensorInfo t;
  t.dtype = *parsed;
  const EntryList& sh = entry.shape;
  if (!sh.present || !sh.is_array) return corrupt_tensor(file, name, "missing or non-array shape");
  bool too_big = false;
  for (uint64_t d : sh.values) too_big |= d > static_cast<uint64_t>(INT64_MAX);
  if (!sh.all_unsigned || too_big) {
    std::string dims =
        sh.all_unsigned ? fmt::format("{}", fmt::join(sh.values, ",")) : fmt::format("{}", fmt::join(sh.text, ","));
    return corrupt_tensor(file, name, fmt::format("shape [{}] is not a list of non-negative integers", dims));
  }
  t.shape.assign(sh.values.begin(), sh.values.end());
  const EntryList& off = entry.offsets;
  if (!off.is_array || !off.all_unsigned || off.values.size() != 2)
    return corrupt_tensor(file, name, "data_offsets must be two non-negative integers");
  uint64_t b = off.values[0], e = off.values[1];
  if (e < b) return corrupt_tensor(file, name, fmt::format("data_offsets [{}, {}] end before they begin", b, e));
  uint64_t numel = 0;
  if (!checked_numel(t.shape, &numel))
    return corrupt_tensor(file, name, fmt::format("shape {} overflows the element count", shape_to_string(t.shape)));
  auto nbytes = dtype_nbytes(t.dtype, numel);
  if (!nbytes)
    return corrupt_tensor(file, name,
                          fmt::format("shape {} of {} is not a whole number of bytes (or overflows)",
                                      shape_to_string(t.shape), dtype_name(t.dtype)));
  if (e - b != *nbytes)
    return corrupt_tensor(file, name,
                          fmt::format("data_offsets [{}, {}] span {} bytes but shape {} of {} needs {}", b, e, e - b,
                                      shape_to_string(t.shape), dtype_name(t.dtype), *nbytes));
  t.name = name;
  t.offset = b;  // relative for now
  t.nbytes = *nbytes;
  h.tensors.push_back(std::move(t));
  return Status();
}

// The fast path: headers as safetensors (and weightlift) write them, compact
// JSON with no whitespace, no escapes, entries holding only dtype, shape and
// data_offsets. Returns false, having changed nothing the caller keeps, for
// anything else (whitespace, an escape, another key, a syntax error, a bad
// entry): the general parser then reads the header and words any error.
// What it accepts is valid JSON read as the general parser reads it.
class CanonicalHeader {
 public:
  CanonicalHeader(std::string_view body, SafetensorsHeader& h)
      : p_(body.data()), end_(body.data() + body.size()), h_(h) {}

  bool parse() {
    if (!eat('{')) return false;
    if (eat('}')) return p_ == end_;
    std::string name;
    Entry entry;
    for (;;) {
      if (!string(&name) || !eat(':')) return false;
      if (name == "__metadata__") {
        if (!metadata()) return false;
      } else {
        if (!fields(&entry)) return false;
        if (!add_entry(h_, {}, name, entry).ok()) return false;
      }
      if (eat('}')) return p_ == end_;
      if (!eat(',')) return false;
    }
  }
  int metadata_keys = 0;

 private:
  bool eat(char c) {
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // A string without escapes; raw UTF-8 was validated for the whole header.
  bool string(std::string* out) {
    if (!eat('"')) return false;
    const char* s = p_;
    while (p_ != end_ && *p_ != '"') {
      if (*p_ == '\\' || static_cast<unsigned char>(*p_) < 0x20) return false;
      ++p_;
    }
    if (p_ == end_) return false;
    out->assign(s, p_ - s);
    ++p_;
    return true;
  }
  // 0 or [1-9][0-9]*, fitting in 64 bits.
  bool number(uint64_t* out) {
    if (p_ == end_ || *p_ < '0' || *p_ > '9') return false;
    if (*p_ == '0') {
      ++p_;
      *out = 0;
      return p_ == end_ || *p_ < '0' || *p_ > '9';
    }
    uint64_t v = 0;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') {
      const uint64_t d = static_cast<uint64_t>(*p_ - '0');
      if (v > (UINT64_MAX - d) / 10) return false;
      v = v * 10 + d;
      ++p_;
    }
    *out = v;
    return true;
  }
  bool numbers(EntryList* list) {
    if (list->present || !eat('[')) return false;  // a repeated key: the general parser decides
    list->present = list->is_array = true;
    if (eat(']')) return true;
    for (;;) {
      uint64_t v;
      if (!number(&v)) return false;
      list->values.push_back(v);
      if (eat(']')) return true;
      if (!eat(',')) return false;
    }
  }
  bool fields(Entry* e) {
    e->clear();
    bool dtype_seen = false;
    if (!eat('{')) return false;
    if (eat('}')) return true;
    std::string key;
    for (;;) {
      if (!string(&key) || !eat(':')) return false;
      if (key == "dtype" && !dtype_seen) {  // a repeated field falls through to `return false` below
        if (!string(&e->dtype)) return false;
        e->dtype_ok = dtype_seen = true;
      } else if (key == "shape") {
        if (!numbers(&e->shape)) return false;
      } else if (key == "data_offsets") {
        if (!numbers(&e->offsets)) return false;
      } else {
        return false;
      }
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }
  bool metadata() {
    ++metadata_keys;
    if (!eat('{')) return false;
    if (eat('}')) return true;
    std::string k, v;
    for (;;) {
      if (!string(&k) || !eat(':') || !string(&v)) return false;
      if (!h_.metadata.try_emplace(k, v).second) return false;  // a repeated key: the general parser words it
      if (eat('}')) return true;
      if (!eat(',')) return false;
    }
  }

  const char* p_;
  const char* end_;
  SafetensorsHeader& h_;
};

// The header in one SAX pass, straight into TensorInfo (no DOM: a header of
// 12,000 tensors parses in a third of the DOM's time). A JSON syntax error is
// reported first (the parse runs to the end), then the first bad entry in
// document order (a repeated field or metadata key is one), then a repeated
// name (found after the pass). (parse() with
// a callback would re-scan each parent object at every end_object: quadratic,
// hours for a header of a million tensors; a SAX pass is linear.)
class HeaderParser final : public nlohmann::json_sax<json> {
 public:
  HeaderParser(SafetensorsHeader& h, std::string_view file) : h_(h), file_(file) {}

  std::string syntax_error;  // set when the JSON itself is invalid
  Status bad_entry;          // the first entry that breaks a rule
  int metadata_keys = 0;     // "__metadata__" seen this many times

  bool start_object(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ >= 2) {  // an object where a field's value (or an array element) goes
      value_is_container(true);
      return true;
    }
    if (depth_ == 1) {
      if (name_ == kMeta) {
        in_meta_ = true;
      } else {
        entry_.clear();
        fields_seen_ = 0;
        other_fields_.clear();
        in_entry_ = true;
      }
    }
    ++depth_;
    return true;
  }
  bool end_object() override {
    if (skip_ > 0) return --skip_, true;
    --depth_;
    if (depth_ == 1) {
      if (in_entry_) finish_entry();
      in_entry_ = in_meta_ = false;
    }
    return true;
  }
  bool start_array(std::size_t) override {
    if (skip_ > 0) return ++skip_, true;
    if (depth_ == 1) {  // a top-level value that is an array
      if (name_ == kMeta)
        fail(corrupt(file_, "__metadata__ is not a string-to-string map"));
      else
        fail(corrupt_tensor(file_, name_, "entry is not an object"));
      skip_ = 1;
      return true;
    }
    if (depth_ == 2 && in_entry_ && (field_ == Field::kShape || field_ == Field::kOffsets)) {
      auto& list = field_ == Field::kShape ? entry_.shape : entry_.offsets;
      list.clear();
      list.present = true;
      list.is_array = true;
      array_ = &list;
      ++depth_;
      return true;
    }
    value_is_container(false);
    return true;
  }
  bool end_array() override {
    if (skip_ > 0) return --skip_, true;
    --depth_;
    array_ = nullptr;
    return true;
  }
  bool key(string_t& k) override {
    if (skip_ > 0) return true;
    if (depth_ == 1) {
      name_.assign(k);
      metadata_keys += name_ == kMeta;
      if (name_ == kMeta && metadata_keys == 2)  // in document order, before its keys look repeated
        fail(corrupt_tensor(file_, kMeta, "duplicate tensor name in header"));
    } else if (depth_ == 2) {
      field_ = Field::kOther;
      if (in_meta_) {
        meta_key_.assign(k);
        if (h_.metadata.count(meta_key_))
          fail(corrupt(file_, fmt::format("__metadata__ repeats the key '{}'", meta_key_)));
        return true;
      }
      if (k == "dtype") {
        field_ = Field::kDtype;
      } else if (k == "shape") {
        field_ = Field::kShape;
      } else if (k == "data_offsets") {
        field_ = Field::kOffsets;
      }
      if (in_entry_) check_repeated_field(k);
    }
    return true;
  }
  bool null() override { return scalar("null"); }
  bool boolean(bool v) override { return scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override { return scalar(std::to_string(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ == 0 && depth_ == 3 && array_) {
      if (array_->all_unsigned)
        array_->values.push_back(v);
      else
        array_->text.push_back(std::to_string(v));
      return true;
    }
    return scalar(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& raw) override { return scalar(raw); }
  bool string(string_t& v) override {
    if (skip_ == 0 && depth_ == 2) {
      if (in_meta_) {
        h_.metadata.try_emplace(std::move(meta_key_), std::move(v));  // a repeated key failed in key()
        return true;
      }
      if (in_entry_ && field_ == Field::kDtype) {
        entry_.dtype.assign(v);
        entry_.dtype_ok = true;
        return true;
      }
    }
    return scalar(json(v).dump());
  }
  bool binary(binary_t&) override { return scalar("<binary>"); }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    syntax_error = e.what();
    return false;
  }

 private:
  static constexpr std::string_view kMeta = "__metadata__";
  enum class Field { kOther, kDtype, kShape, kOffsets };
  using List = EntryList;

  void fail(Status s) {
    if (bad_entry.ok() && !s.ok()) bad_entry = std::move(s);
  }
  // A scalar value (or the text of an array element that is not an unsigned integer).
  bool scalar(const std::string& text) {
    if (skip_ > 0) return true;
    if (depth_ == 3 && array_) {
      array_->not_unsigned();
      array_->text.push_back(text);
      return true;
    }
    if (depth_ == 1) {  // a top-level value that is not an object
      if (name_ == kMeta)
        fail(corrupt(file_, "__metadata__ is not a string-to-string map"));
      else
        fail(corrupt_tensor(file_, name_, "entry is not an object"));
    } else if (depth_ == 2) {
      mark_field(false);
    }
    return true;
  }
  // An object or array where a field's value goes: wrong for every field we read.
  void value_is_container(bool object) {
    if (depth_ == 3 && array_) {
      array_->not_unsigned();
      array_->text.push_back(object ? "{...}" : "[...]");
    } else if (depth_ == 2) {
      mark_field(true);
    }
    skip_ = 1;
  }
  void mark_field(bool container) {
    if (in_meta_) {
      fail(corrupt(file_, fmt::format("__metadata__ value of '{}' is not a string", meta_key_)));
      return;
    }
    switch (field_) {
      case Field::kDtype: entry_.dtype_ok = false; break;
      case Field::kShape:
      case Field::kOffsets: {
        auto& list = field_ == Field::kShape ? entry_.shape : entry_.offsets;
        list.clear();
        list.present = true;  // present, not an array
        (void)container;
        break;
      }
      case Field::kOther: break;
    }
  }
  void finish_entry() {
    if (bad_entry.ok()) fail(add_entry(h_, file_, name_, entry_));
  }
  // A field the entry already has (dtype, shape, data_offsets, or one we do not read).
  void check_repeated_field(const std::string& k) {
    bool repeated;
    if (field_ != Field::kOther) {
      const unsigned bit = 1u << static_cast<unsigned>(field_);
      repeated = (fields_seen_ & bit) != 0;
      fields_seen_ |= bit;
    } else {
      repeated = !other_fields_.insert(k).second;
    }
    if (repeated) fail(corrupt_tensor(file_, name_, fmt::format("the entry repeats the field '{}'", k)));
  }

  SafetensorsHeader& h_;
  std::string_view file_;
  int depth_ = 0;         // containers open, not counting skipped ones
  int skip_ = 0;          // > 0: inside a value being skipped (this many containers deep)
  std::string name_;      // the current top-level key
  std::string meta_key_;  // the current key inside __metadata__
  bool in_meta_ = false, in_entry_ = false;
  Field field_ = Field::kOther;
  unsigned fields_seen_ = 0;                      // bits of Field: the known fields the entry has had
  std::unordered_set<std::string> other_fields_;  // the entry's other fields so far
  Entry entry_;
  List* array_ = nullptr;  // the shape / data_offsets array being read
};

// The general parser's pass over `body` into `h`. Out of line: the fast path's
// caller stays as small as the fast path needs.
[[gnu::noinline]] Status parse_general(std::string_view body, std::string_view file, SafetensorsHeader& h,
                                       int* metadata_keys) {
  HeaderParser parser(h, file);
  if (!json::sax_parse(body, &parser) || !parser.syntax_error.empty())
    return corrupt(file, fmt::format("header is not valid JSON: {}", parser.syntax_error));
  if (!parser.bad_entry.ok()) return parser.bad_entry;
  *metadata_keys = parser.metadata_keys;
  return Status();
}

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(std::string_view text, uint64_t file_size, std::string_view file) {
  SafetensorsHeader h;
  h.header_size = text.size();
  h.data_start = 8 + text.size();
  if (text.size() > kSafetensorsMaxHeader)
    return corrupt(file,
                   fmt::format("header of {} bytes exceeds the {} byte limit", text.size(), kSafetensorsMaxHeader));
  if (!is_valid_utf8(text)) return corrupt(file, "header is not valid UTF-8");
  if (text.empty() || text.front() != '{') return corrupt(file, "header does not start with '{'");
  // Trailing spaces are padding; anything else after the object is a JSON error.
  size_t end = text.find_last_not_of(' ');
  std::string_view body = text.substr(0, end + 1);

  CanonicalHeader fast(body, h);
  int metadata_keys = 0;
  if (fast.parse()) {
    metadata_keys = fast.metadata_keys;
  } else {
    h.tensors.clear();
    h.metadata.clear();
    WL_RETURN_IF_ERROR(parse_general(body, file, h, &metadata_keys));
  }
  if (metadata_keys > 1) return corrupt_tensor(file, "__metadata__", "duplicate tensor name in header");
  {
    std::unordered_set<std::string_view> names;
    names.reserve(h.tensors.size());
    for (auto& t : h.tensors)
      if (!names.insert(t.name).second) return corrupt_tensor(file, t.name, "duplicate tensor name in header");
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t cursor = 0;
  for (auto& t : h.tensors) {
    if (t.offset != cursor)
      return corrupt_tensor(
          file, t.name,
          t.offset > cursor
              ? fmt::format("gap in the data area: tensor begins at {} but the previous one ends at {}", t.offset,
                            cursor)
              : fmt::format("tensor overlaps the previous one: begins at {} before {}", t.offset, cursor));
    cursor = t.offset + t.nbytes;
    t.offset += h.data_start;
  }
  uint64_t expected = 0;
  if (!checked_add(h.data_start, cursor, &expected) || expected != file_size)
    return corrupt(
        file, fmt::format("data area ends at byte {} but the file has {} bytes", h.data_start + cursor, file_size));
  return h;
}

Result<SafetensorsHeader> read_safetensors_header(const RandomAccessFile& file) {
  const uint64_t size = file.size();
  if (size < 8)
    return corrupt(file.path(), fmt::format("file of {} bytes is too small for a safetensors header", size));
  std::byte len_bytes[8];
  WL_RETURN_IF_ERROR(file.read_at(0, len_bytes));
  uint64_t n = load_le64(len_bytes);
  if (n > kSafetensorsMaxHeader)
    return corrupt(file.path(), fmt::format("header length {} exceeds the {} byte limit", n, kSafetensorsMaxHeader));
  if (n > size - 8)
    return corrupt(file.path(), fmt::format("header length {} is past the end of the file ({} bytes)", n, size));
  // Read, never faulted from a mapping: a fault on a cold page reads a whole
  // readahead window around it (8 MiB on some disks), which would pull the
  // payload into the page cache outside the planner's reads.
  std::string text(n, '\0');
  WL_RETURN_IF_ERROR(file.read_at(8, std::as_writable_bytes(std::span(text.data(), text.size()))));
  return parse_safetensors_header(text, size, file.path());
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path, FileMode mode, Env* env) {
  OpenOptions o;
  o.mode = mode;
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, o));
  return open(std::move(f), mode);
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(std::shared_ptr<RandomAccessFile> file, FileMode mode) {
  std::shared_ptr<SafetensorsFile> sf(new SafetensorsFile());
  sf->file_ = std::move(file);
  if (mode == FileMode::kPread || mode == FileMode::kDirect) {  // eager: read whole
    const uint64_t size = sf->file_->size();
    if (size < 8)
      return corrupt(sf->file_->path(), fmt::format("file of {} bytes is too small for a safetensors header", size));
    WL_ASSIGN_OR_RETURN(Buffer buf, Buffer::allocate(size, 4096), .file = sf->file_->path());
    WL_RETURN_IF_ERROR(sf->file_->read_at(0, buf.span()));
    uint64_t n = load_le64(buf.data());
    if (n > kSafetensorsMaxHeader)
      return corrupt(sf->file_->path(),
                     fmt::format("header length {} exceeds the {} byte limit", n, kSafetensorsMaxHeader));
    if (n > size - 8)
      return corrupt(sf->file_->path(),
                     fmt::format("header length {} is past the end of the file ({} bytes)", n, size));
    std::string_view text(reinterpret_cast<const char*>(buf.data()) + 8, n);
    WL_ASSIGN_OR_RETURN(sf->header_, parse_safetensors_header(text, size, sf->file_->path()));
    sf->eager_ = std::make_shared<Buffer>(std::move(buf));
  } else {
    WL_ASSIGN_OR_RETURN(sf->header_, read_safetensors_header(*sf->file_));
  }
  sf->by_name_.reserve(sf->header_.tensors.size());
  for (size_t i = 0; i < sf->header_.tensors.size(); ++i) sf->by_name_.emplace(sf->header_.tensors[i].name, i);
  return sf;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(header_.tensors.size());
  for (auto& t : header_.tensors) out.push_back(t.name);
  std::sort(out.begin(), out.end());
  return out;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

Result<TensorView> SafetensorsFile::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound("no such tensor in file").with_file(path()).with_tensor(name);
  if (eager_) {
    return TensorView(t->dtype, t->shape, std::span<const std::byte>(eager_->data() + t->offset, t->nbytes), eager_);
  }
  auto v = file_->view(t->offset, t->nbytes);
  if (v.ok()) return TensorView(t->dtype, t->shape, *v, file_);
  WL_ASSIGN_OR_RETURN(Tensor owned, read(name));
  return owned.view();
}

Result<Tensor> SafetensorsFile::read(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound("no such tensor in file").with_file(path()).with_tensor(name);
  WL_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(t->dtype, t->shape));
  if (eager_) {
    if (t->nbytes) std::memcpy(out.mutable_bytes().data(), eager_->data() + t->offset, t->nbytes);
    return out;
  }
  WL_RETURN_IF_ERROR(file_->read_at(t->offset, out.mutable_bytes()), .tensor = name);
  return out;
}

Result<Tensor> SafetensorsFile::read_slice(std::string_view name, int dim, int64_t begin, int64_t end) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) return Status::NotFound("no such tensor in file").with_file(path()).with_tensor(name);
  if (t->shape.empty())
    return Status::InvalidArgument("cannot slice a 0-dim tensor").with_file(path()).with_tensor(name);
  const int nd = static_cast<int>(t->shape.size());
  const int d = dim < 0 ? dim + nd : dim;
  if (d < 0 || d >= nd)
    return Status::InvalidArgument(
               fmt::format("slice dim {} is out of range for shape {}", dim, shape_to_string(t->shape)))
        .with_file(path())
        .with_tensor(name);
  if (begin < 0 || end < begin)
    return Status::InvalidArgument(fmt::format("invalid slice [{}, {})", begin, end))
        .with_file(path())
        .with_tensor(name);
  begin = std::min(begin, t->shape[d]);
  end = std::min(end, t->shape[d]);
  WL_ASSIGN_OR_RETURN(auto l, slice_layout(t->dtype, t->shape, d, begin, end - begin), .tensor = name, .file = path());
  WL_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(t->dtype, l.shape));
  std::byte* dst = out.mutable_bytes().data();
  for (uint64_t i = 0; i < l.outer && l.run > 0; ++i) {
    const uint64_t off = t->offset + l.first + i * l.stride;
    if (eager_) {
      std::memcpy(dst + i * l.run, eager_->data() + off, l.run);
      continue;
    }
    WL_RETURN_IF_ERROR(file_->read_at(off, std::span(dst + i * l.run, l.run)), .tensor = name);
  }
  return out;
}

}  // namespace wl

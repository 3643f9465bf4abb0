#include <algorithm>
#include <cstring>
#include <set>

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

// Counts the keys of the top-level object and, when asked, finds the first
// one that repeats. A SAX pass: no DOM, linear time. (parse() with a callback
// would do it in one pass, but nlohmann's callback parser re-scans the whole
// parent object at every end_object: quadratic in the number of tensors,
// hours for a header of a million tensors.)
class TopLevelKeys final : public nlohmann::json_sax<json> {
 public:
  explicit TopLevelKeys(bool find_duplicate) : find_duplicate_(find_duplicate) {}
  size_t count = 0;
  std::string duplicate;

  bool key(string_t& k) override {
    if (depth_ != 1) return true;
    ++count;
    if (find_duplicate_ && duplicate.empty() && !seen_.insert(k).second) duplicate = k;
    return true;
  }
  bool start_object(std::size_t) override { return ++depth_, true; }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override { return ++depth_, true; }
  bool end_array() override { return --depth_, true; }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const json::exception&) override { return false; }

 private:
  bool find_duplicate_;
  int depth_ = 0;
  std::set<std::string, std::less<>> seen_;
};

}  // namespace

Result<SafetensorsHeader> parse_safetensors_header(std::string_view text, uint64_t file_size, std::string_view file) {
  SafetensorsHeader h;
  h.header_size = text.size();
  h.data_start = 8 + text.size();
  if (text.size() > kSafetensorsMaxHeader)
    return corrupt(file, fmt::format("header of {} bytes exceeds the {} byte limit", text.size(), kSafetensorsMaxHeader));
  if (!is_valid_utf8(text)) return corrupt(file, "header is not valid UTF-8");
  if (text.empty() || text.front() != '{') return corrupt(file, "header does not start with '{'");
  // Trailing spaces are padding; anything else after the object is a JSON error.
  size_t end = text.find_last_not_of(' ');
  std::string_view body = text.substr(0, end + 1);

  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::exception& e) {
    return corrupt(file, fmt::format("header is not valid JSON: {}", e.what()));
  }
  // The DOM keeps the last of duplicate keys: fewer members than keys means a
  // repeated name, which a second pass then finds.
  if (doc.is_object()) {
    TopLevelKeys keys(false);
    json::sax_parse(body, &keys);
    if (keys.count != doc.size()) {
      TopLevelKeys dup(true);
      json::sax_parse(body, &dup);
      return corrupt_tensor(file, dup.duplicate, "duplicate tensor name in header");
    }
  }
  if (!doc.is_object()) return corrupt(file, "header is not a JSON object");

  h.tensors.reserve(doc.size());
  for (auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return corrupt(file, "__metadata__ is not a string-to-string map");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) return corrupt(file, fmt::format("__metadata__ value of '{}' is not a string", k));
        h.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    if (!entry.is_object()) return corrupt_tensor(file, name, "entry is not an object");
    TensorInfo t;
    t.name = name;
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) return corrupt_tensor(file, name, "missing or non-string dtype");
    auto parsed = dtype_from_name(dt->get_ref<const std::string&>());
    if (!parsed || !dtype_in_safetensors(*parsed))
      return corrupt_tensor(file, name, fmt::format("unknown dtype '{}'", dt->get<std::string>()));
    t.dtype = *parsed;
    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) return corrupt_tensor(file, name, "missing or non-array shape");
    for (auto& d : *sh) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        return corrupt_tensor(file, name, fmt::format("shape {} is not a list of non-negative integers", sh->dump()));
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      return corrupt_tensor(file, name, "data_offsets must be two non-negative integers");
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
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
    t.offset = b;  // relative for now
    t.nbytes = *nbytes;
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t cursor = 0;
  for (auto& t : h.tensors) {
    if (t.offset != cursor)
      return corrupt_tensor(file, t.name,
                            t.offset > cursor
                                ? fmt::format("gap in the data area: tensor begins at {} but the previous one ends at {}",
                                              t.offset, cursor)
                                : fmt::format("tensor overlaps the previous one: begins at {} before {}", t.offset,
                                              cursor));
    cursor = t.offset + t.nbytes;
    t.offset += h.data_start;
  }
  uint64_t expected = 0;
  if (!checked_add(h.data_start, cursor, &expected) || expected != file_size)
    return corrupt(file, fmt::format("data area ends at byte {} but the file has {} bytes", h.data_start + cursor,
                                     file_size));
  return h;
}

Result<SafetensorsHeader> read_safetensors_header(const RandomAccessFile& file) {
  const uint64_t size = file.size();
  if (size < 8) return corrupt(file.path(), fmt::format("file of {} bytes is too small for a safetensors header", size));
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

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path, LoadMode mode, Env* env) {
  OpenOptions o;
  o.mode = mode == LoadMode::kLazy ? FileMode::kMmap : FileMode::kPread;
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, o));
  return open(std::move(f), mode);
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(std::shared_ptr<RandomAccessFile> file, LoadMode mode) {
  std::shared_ptr<SafetensorsFile> sf(new SafetensorsFile());
  sf->file_ = std::move(file);
  if (mode == LoadMode::kEager) {
    const uint64_t size = sf->file_->size();
    if (size < 8)
      return corrupt(sf->file_->path(), fmt::format("file of {} bytes is too small for a safetensors header", size));
    auto allocated = Buffer::allocate(size, 4096);
    if (!allocated.ok()) return std::move(allocated).status().with_file(sf->file_->path());
    Buffer buf = std::move(*allocated);
    WL_RETURN_IF_ERROR(sf->file_->read_at(0, buf.span()));
    uint64_t n = load_le64(buf.data());
    if (n > kSafetensorsMaxHeader)
      return corrupt(sf->file_->path(), fmt::format("header length {} exceeds the {} byte limit", n, kSafetensorsMaxHeader));
    if (n > size - 8)
      return corrupt(sf->file_->path(), fmt::format("header length {} is past the end of the file ({} bytes)", n, size));
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
  Status s = file_->read_at(t->offset, out.mutable_bytes());
  if (!s.ok()) return std::move(s).with_tensor(name);
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
    return Status::InvalidArgument(fmt::format("slice dim {} is out of range for shape {}", dim, shape_to_string(t->shape)))
        .with_file(path()).with_tensor(name);
  if (begin < 0 || end < begin)
    return Status::InvalidArgument(fmt::format("invalid slice [{}, {})", begin, end)).with_file(path()).with_tensor(name);
  begin = std::min(begin, t->shape[d]);
  end = std::min(end, t->shape[d]);
  auto l = slice_layout(t->dtype, t->shape, d, begin, end - begin);
  if (!l.ok()) return Status(l.status()).with_file(path()).with_tensor(name);
  WL_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(t->dtype, l->shape));
  std::byte* dst = out.mutable_bytes().data();
  for (uint64_t i = 0; i < l->outer && l->run > 0; ++i) {
    const uint64_t off = t->offset + l->first + i * l->stride;
    if (eager_) {
      std::memcpy(dst + i * l->run, eager_->data() + off, l->run);
      continue;
    }
    Status s = file_->read_at(off, std::span(dst + i * l->run, l->run));
    if (!s.ok()) return std::move(s).with_tensor(name);
  }
  return out;
}

}  // namespace wl

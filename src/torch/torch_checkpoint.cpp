// PyTorch checkpoints: the zip format (torch.save since 1.6) and the legacy stream.
#include "weightlift/torch.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "torch/strided_copy.h"
#include "torch/torch_pickle.h"
#include "torch/zip_reader.h"
#include "util/checked.h"

namespace wl {
namespace {

constexpr uint64_t kMaxPickle = uint64_t{1} << 30;
const unsigned char kLegacyMagic[10] = {0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
constexpr int64_t kLegacyProtocol = 1001;

// Byte width of the unit that byte order applies to (complex: each component).
size_t swap_unit(DType t) {
  switch (t) {
    case DType::C64: return 4;
    case DType::C128: return 8;
    case DType::C32: return 2;
    default: return static_cast<size_t>(std::max(dtype_size(t), 1));
  }
}

void byteswap(std::byte* p, size_t nbytes, size_t unit) {
  if (unit <= 1) return;
  for (size_t i = 0; i + unit <= nbytes; i += unit) std::reverse(p + i, p + i + unit);
}

void gather(const std::byte* base, size_t esize, const TorchTensor& t, std::byte* dst) {
  strided_copy(base, esize, t.storage_offset, t.sizes, t.strides, dst);
}

bool is_contiguous(const Shape& sz, const std::vector<int64_t>& st) {
  int64_t expected = 1;
  for (size_t k = sz.size(); k-- > 0;) {
    if (sz[k] == 0) return true;
    if (sz[k] != 1 && st[k] != expected) return false;
    expected *= sz[k];
  }
  return true;
}

class Builder {
 public:
  Builder(TorchCheckpoint* ck, const TorchOpenOptions& o) : ck_(ck), opts_(o) {}

  // Storage requests are recorded as they come; the zip reader resolves them at once.
  Result<size_t> add_storage(const pickle::StorageRequest& r, const zip::Archive* ar, const std::string& prefix) {
    std::string key = r.has_view ? r.view_key : r.key;
    std::string ident = key + '\0' + std::string(dtype_name(*r.dtype));
    auto it = index_.find(ident);
    if (it != index_.end()) return it->second;
    TorchStorage s;
    s.key = key;
    s.dtype = *r.dtype;
    uint64_t esize = static_cast<uint64_t>(dtype_size(s.dtype));
    s.numel = r.has_view ? r.view_size : r.numel;
    if (!checked_mul(s.numel, esize, &s.nbytes) || s.nbytes > ck_->file_->size())
      return Status::Corrupt(fmt::format("storage '{}' declares {} elements of {}, more than the file holds", key,
                                         s.numel, dtype_name(s.dtype)))
          .with_file(ck_->path_);
    if (ar) {
      std::string rec = prefix + "data/" + r.key;
      const zip::Entry* e = ar->find(rec);
      if (!e)
        return Status::Corrupt(fmt::format("storage record '{}' is missing from the archive", rec))
            .with_file(ck_->path_);
      if (e->method != 0)
        return Status::Unimplemented(fmt::format("storage record '{}' is compressed (method {}); torch.save stores "
                                                 "records uncompressed",
                                                 rec, e->method))
            .with_file(ck_->path_);
      if (e->size < s.nbytes)
        return Status::Corrupt(fmt::format("storage record '{}' holds {} bytes but the pickle declares {} elements of "
                                           "{} ({} bytes)",
                                           rec, e->size, s.numel, dtype_name(s.dtype), s.nbytes))
            .with_file(ck_->path_);
      s.file_offset = e->data_offset;
    } else {
      legacy_requests_.push_back(r);
    }
    ck_->storages_.push_back(std::move(s));
    index_.emplace(ident, ck_->storages_.size() - 1);
    return ck_->storages_.size() - 1;
  }

  // Builds the tensor list from the unpickled root.
  Status finish(const pickle::Value* root, const pickle::Unpickler& u) {
    if (opts_.unwrap_state_dict && root->kind == pickle::Kind::kDict) {
      for (size_t k = 0; k + 1 < root->items.size(); k += 2) {
        if (root->items[k]->kind == pickle::Kind::kStr && root->items[k]->s == "state_dict") {
          root = root->items[k + 1];
          ck_->unwrapped_state_dict_ = true;
          break;
        }
      }
    }
    std::vector<std::pair<std::string, size_t>> named;
    WL_RETURN_IF_ERROR(pickle::flatten_tensors(root, &named, ck_->path_));
    std::unordered_map<std::string, size_t> seen;
    for (auto& [name, ti] : named) {
      const pickle::TensorRec& r = u.tensors()[ti];
      const TorchStorage& s = ck_->storages_[r.storage];
      TorchTensor t;
      t.name = name;
      t.dtype = s.dtype;
      t.sizes = r.sizes;
      t.strides = r.strides;
      t.storage_offset = r.offset;
      t.storage = r.storage;
      t.requires_grad = r.requires_grad;
      t.is_parameter = r.is_parameter;
      uint64_t numel = 0, nbytes = 0;
      // t.name, not the structured binding: clang 14 cannot capture bindings in a lambda.
      auto bad = [&](std::string what) {
        return Status::Corrupt(std::move(what)).with_file(ck_->path_).with_tensor(t.name);
      };
      if (!checked_numel(t.sizes, &numel)) return bad(fmt::format("shape {} overflows", shape_to_string(t.sizes)));
      auto nb = dtype_nbytes(t.dtype, numel);
      if (!nb) return bad(fmt::format("shape {} overflows", shape_to_string(t.sizes)));
      nbytes = *nb;
      if (numel > 0) {
        uint64_t last = t.storage_offset;
        for (size_t d = 0; d < t.sizes.size(); ++d) {
          uint64_t span = 0;
          if (!checked_mul(static_cast<uint64_t>(t.sizes[d] - 1), static_cast<uint64_t>(t.strides[d]), &span) ||
              !checked_add(last, span, &last))
            return bad("sizes and strides overflow");
        }
        if (last >= s.numel)
          return bad(fmt::format(
              "tensor of shape {} (offset {}, strides {}) reaches element {} but its storage '{}' "
              "holds only {} elements",
              shape_to_string(t.sizes), t.storage_offset, shape_to_string(t.strides), last, s.key, s.numel));
      }
      t.contiguous = is_contiguous(t.sizes, t.strides);
      if (!seen.emplace(name, ck_->strided_.size()).second) return bad("duplicate tensor name");
      CheckpointTensor info{{name, t.dtype, t.sizes, nbytes}};
      if (t.contiguous && !ck_->big_endian_)
        info.file_offset = s.file_offset + t.storage_offset * static_cast<uint64_t>(dtype_size(t.dtype));
      ck_->infos_.push_back(std::move(info));
      ck_->strided_.push_back(std::move(t));
    }
    return Status();
  }

  std::vector<pickle::StorageRequest> legacy_requests_;

 private:
  TorchCheckpoint* ck_;
  TorchOpenOptions opts_;
  std::unordered_map<std::string, size_t> index_;
};

Result<std::shared_ptr<TorchCheckpoint>> open_zip(std::shared_ptr<TorchCheckpoint> ck, const TorchOpenOptions& o) {
  const std::string& path = ck->path_;
  WL_ASSIGN_OR_RETURN(zip::Archive ar, zip::Archive::open(ck->file_));
  // The archive's records live under one top-level folder ("archive/", or the file's stem).
  const zip::Entry* pkl = nullptr;
  for (auto& e : ar.entries()) {
    auto slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      if (pkl)
        return Status::Corrupt(fmt::format("two pickles in one checkpoint: '{}' and '{}'", pkl->name, e.name))
            .with_file(path);
      pkl = &e;
    }
  }
  if (!pkl)
    return Status::Corrupt("zip archive has no '<name>/data.pkl' record; not a torch.save checkpoint").with_file(path);
  std::string prefix = pkl->name.substr(0, pkl->name.size() - std::string_view("data.pkl").size());
  if (const zip::Entry* bo = ar.find(prefix + "byteorder")) {
    WL_ASSIGN_OR_RETURN(std::string order, ar.read(*bo, 16));
    if (order == "big")
      ck->big_endian_ = true;
    else if (order != "little")
      return Status::Corrupt(fmt::format("byteorder record says '{}', expected 'little' or 'big'", order))
          .with_file(path);
  }
  WL_ASSIGN_OR_RETURN(std::string data, ar.read(*pkl, std::min(kMaxPickle, ck->file_->size())));
  Builder b(ck.get(), o);
  pickle::Unpickler u(path, [&](const pickle::StorageRequest& r) { return b.add_storage(r, &ar, prefix); });
  WL_ASSIGN_OR_RETURN(pickle::Value * root, u.load(data));
  WL_RETURN_IF_ERROR(b.finish(root, u));
  return ck;
}

// The pickles come first, the storages after them: `head_len` bytes of the file are decoded;
// *short is set when a pickle ran past them (the caller retries with more).
Result<std::shared_ptr<TorchCheckpoint>> open_legacy_head(std::shared_ptr<TorchCheckpoint> ck,
                                                          const TorchOpenOptions& o, uint64_t head_len,
                                                          bool* short_head) {
  const std::string& path = ck->path_;
  const RandomAccessFile& f = *ck->file_;
  ck->legacy_ = true;
  std::string head(head_len, '\0');
  WL_RETURN_IF_ERROR(f.read_at(0, std::as_writable_bytes(std::span(head.data(), head.size()))));
  std::string_view rest = head;
  size_t used = 0;
  Builder b(ck.get(), o);
  pickle::Unpickler u(path, [&](const pickle::StorageRequest& r) { return b.add_storage(r, nullptr, ""); });
  auto legacy_error = [&](std::string what) {
    return Status::Corrupt("legacy PyTorch checkpoint: " + what).with_file(path);
  };
  auto load = [&](pickle::Value** out) -> Status {
    auto r = u.load(rest, &used);
    if (!r.ok()) {
      const std::string& m = r.status().message();
      if (head_len < f.size() && (m.find("truncated pickle") != std::string::npos ||
                                  m.find("runs past the end of the pickle") != std::string::npos))
        *short_head = true;
      return r.status();
    }
    *out = *r;
    return Status();
  };
  pickle::Value* magic = nullptr;
  WL_RETURN_IF_ERROR(load(&magic));
  if (magic->kind != pickle::Kind::kOther ||
      magic->s != std::string_view(reinterpret_cast<const char*>(kLegacyMagic), 10))
    return legacy_error("bad magic number (not a file written by torch.save)");
  rest.remove_prefix(used);
  pickle::Value* proto = nullptr;
  WL_RETURN_IF_ERROR(load(&proto));
  if (proto->kind != pickle::Kind::kInt || proto->i != kLegacyProtocol)
    return Status::Unimplemented(fmt::format("legacy PyTorch checkpoint: protocol {} is not supported (expected {})",
                                             proto->i, kLegacyProtocol))
        .with_file(path);
  rest.remove_prefix(used);
  pickle::Value* sys_info = nullptr;
  WL_RETURN_IF_ERROR(load(&sys_info));
  rest.remove_prefix(used);
  if (sys_info->kind == pickle::Kind::kDict) {
    for (size_t k = 0; k + 1 < sys_info->items.size(); k += 2)
      if (sys_info->items[k]->kind == pickle::Kind::kStr && sys_info->items[k]->s == "little_endian" &&
          sys_info->items[k + 1]->kind == pickle::Kind::kBool)
        ck->big_endian_ = sys_info->items[k + 1]->i == 0;
  }
  pickle::Value* root = nullptr;
  WL_RETURN_IF_ERROR(load(&root));
  rest.remove_prefix(used);
  pickle::Value* keys = nullptr;
  WL_RETURN_IF_ERROR(load(&keys));
  rest.remove_prefix(used);
  if (keys->kind != pickle::Kind::kList) return legacy_error("the storage key list is not a list");

  // Raw storages follow, in key-list order: an 8-byte element count, then the bytes.
  struct Root {
    DType dtype;
    uint64_t offset = 0;
    uint64_t numel = 0;
    bool placed = false;
  };
  std::map<std::string, Root> roots;
  for (auto& r : b.legacy_requests_) roots.emplace(r.key, Root{*r.dtype});
  uint64_t off = head_len - rest.size();
  for (auto* k : keys->items) {
    if (k->kind != pickle::Kind::kStr) return legacy_error("a storage key is not a string");
    auto it = roots.find(k->s);
    if (it == roots.end()) return legacy_error(fmt::format("storage '{}' is listed but never used", k->s));
    std::byte cnt[8];
    uint64_t end = 0;
    if (!checked_add(off, 8, &end) || end > f.size())
      return legacy_error(fmt::format("file ends before storage '{}' (truncated)", k->s));
    WL_RETURN_IF_ERROR(f.read_at(off, cnt));
    if (ck->big_endian_) std::reverse(cnt, cnt + 8);
    uint64_t numel = 0;
    std::memcpy(&numel, cnt, 8);
    uint64_t nbytes = 0;
    if (!checked_mul(numel, static_cast<uint64_t>(dtype_size(it->second.dtype)), &nbytes) ||
        !checked_add(end, nbytes, &off) || off > f.size())
      return legacy_error(
          fmt::format("storage '{}' declares {} elements, more than the rest of the file (truncated?)", k->s, numel));
    it->second.offset = end;
    it->second.numel = numel;
    it->second.placed = true;
  }
  for (auto& r : b.legacy_requests_) {
    const Root& rt = roots[r.key];
    if (!rt.placed) return legacy_error(fmt::format("storage '{}' has no data", r.key));
    std::string key = r.has_view ? r.view_key : r.key;
    for (auto& s : ck->storages_) {
      if (s.key != key || s.dtype != *r.dtype) continue;
      uint64_t begin = r.has_view ? r.view_offset : 0, end = 0;
      if (!checked_add(begin, s.numel, &end) || end > rt.numel)
        return legacy_error(fmt::format("storage '{}' needs {} elements but its data holds {}", key, end, rt.numel));
      s.file_offset = rt.offset + begin * static_cast<uint64_t>(dtype_size(s.dtype));
    }
  }
  WL_RETURN_IF_ERROR(b.finish(root, u));
  return ck;
}

// Starts with 16 MiB of pickles and grows x8 up to kMaxPickle: a multi-GB legacy file is not read whole.
Result<std::shared_ptr<TorchCheckpoint>> open_legacy(std::shared_ptr<TorchCheckpoint> ck, const TorchOpenOptions& o) {
  const uint64_t limit = std::min(kMaxPickle, ck->file_->size());
  for (uint64_t len = std::min<uint64_t>(limit, uint64_t{16} << 20);; len = std::min(limit, len * 8)) {
    auto fresh = std::make_shared<TorchCheckpoint>();
    fresh->path_ = ck->path_;
    fresh->file_ = ck->file_;
    bool short_head = false;
    auto r = open_legacy_head(fresh, o, len, &short_head);
    if (r.ok() || !short_head || len == limit) return r;
  }
}

}  // namespace

Result<std::shared_ptr<TorchCheckpoint>> TorchCheckpoint::open(const std::string& path, Env* env,
                                                               const TorchOpenOptions& options) {
  auto ck = std::make_shared<TorchCheckpoint>();
  ck->path_ = path;
  WL_ASSIGN_OR_RETURN(ck->file_, env->open(path, {.mode = FileMode::kMmap, .populate = options.populate}),
                      .file = path);
  const uint64_t size = ck->file_->size();
  unsigned char head[4] = {};
  if (size >= 4) WL_RETURN_IF_ERROR(ck->file_->read_at(0, std::as_writable_bytes(std::span(head))));
  Result<std::shared_ptr<TorchCheckpoint>> r = Status::Internal("unset");
  if (size >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4) {
    r = open_zip(ck, options);
  } else if (size >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5) {
    r = open_legacy(ck, options);
  } else {
    if (size >= 262) {
      char ustar[5];
      WL_RETURN_IF_ERROR(ck->file_->read_at(257, std::as_writable_bytes(std::span(ustar))));
      if (std::string_view(ustar, 5) == "ustar")
        return Status::Unimplemented("tar-format PyTorch checkpoints (torch < 0.4) are not supported").with_file(path);
    }
    return Status::Corrupt("not a PyTorch checkpoint: neither a zip archive nor a legacy pickle stream")
        .with_file(path);
  }
  if (!r.ok()) return std::move(r).status().with_file(path);
  if ((*r)->big_endian_)
    for (auto& t : (*r)->infos_) t.file_offset.reset();
  return r;
}

Result<TensorView> TorchCheckpoint::storage_bytes(size_t i) const {
  if (i >= storages_.size()) return Status::OutOfRange("storage index out of range").with_file(path_);
  const TorchStorage& s = storages_[i];
  auto v = file_->view(s.file_offset, s.nbytes);
  if (v.ok()) return TensorView(DType::U8, Shape{static_cast<int64_t>(s.nbytes)}, *v, file_);
  WL_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(DType::U8, Shape{static_cast<int64_t>(s.nbytes)}));
  WL_RETURN_IF_ERROR(file_->read_at(s.file_offset, t.mutable_bytes()));
  return t.view();
}

namespace {
// A private row-major copy: one read for a contiguous tensor, a gather otherwise; byte-swapped if big-endian.
Result<Tensor> materialize(const TorchCheckpoint& ck, size_t i) {
  const TorchTensor& t = ck.strided()[i];
  const CheckpointTensor& info = ck.tensors()[i];
  WL_ASSIGN_OR_RETURN(Tensor out, Tensor::empty(t.dtype, t.sizes));
  if (info.nbytes == 0) return out;
  if (info.file_offset) {
    WL_RETURN_IF_ERROR(ck.file_->read_at(*info.file_offset, out.mutable_bytes()));
  } else {
    WL_ASSIGN_OR_RETURN(TensorView storage, ck.storage_bytes(t.storage));
    gather(storage.data(), static_cast<size_t>(dtype_size(t.dtype)), t, out.mutable_bytes().data());
  }
  if (ck.big_endian()) byteswap(out.mutable_bytes().data(), out.nbytes(), swap_unit(t.dtype));
  return out;
}
}  // namespace

Result<TensorView> TorchCheckpoint::view(size_t i) const {
  if (i >= strided_.size()) return Status::OutOfRange("tensor index out of range").with_file(path_);
  const CheckpointTensor& info = infos_[i];
  if (info.file_offset) {
    auto v = file_->view(*info.file_offset, info.nbytes);
    if (v.ok()) return TensorView(info.dtype, info.shape, *v, file_);
  }
  WL_ASSIGN_OR_RETURN(Tensor out, materialize(*this, i));
  return out.view();
}

Result<Tensor> TorchCheckpoint::read(size_t i) const {
  if (i >= strided_.size()) return Status::OutOfRange("tensor index out of range").with_file(path_);
  return materialize(*this, i);
}

Result<std::unique_ptr<CheckpointReader>> open_pytorch_checkpoint(const std::string& path, Env* env) {
  WL_ASSIGN_OR_RETURN(auto ck, TorchCheckpoint::open(path, env));
  struct Holder final : CheckpointReader {
    std::shared_ptr<TorchCheckpoint> ck;
    const std::string& path() const override { return ck->path(); }
    std::string_view format_name() const override { return "pytorch"; }
    std::string version() const override { return ck->version(); }
    const std::vector<CheckpointTensor>& tensors() const override { return ck->tensors(); }
    Result<TensorView> view(size_t i) const override { return ck->view(i); }
    Result<Tensor> read(size_t i) const override { return ck->read(i); }
  };
  auto h = std::make_unique<Holder>();
  h->ck = std::move(ck);
  return std::unique_ptr<CheckpointReader>(std::move(h));
}

const CheckpointFormat& pytorch_format() {
  static constexpr std::string_view kExtensions[] = {".bin", ".pt", ".pth"};
  static constexpr std::string_view kMagics[] = {"PK", "\x80"};  // a zip archive; the legacy stream's PROTO
  static const CheckpointFormat kFormat{WeightFormat::kPytorch, "pytorch", kExtensions, kMagics,
                                        &open_pytorch_checkpoint};
  return kFormat;
}

}  // namespace wl

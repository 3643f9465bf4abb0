#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/checked.h"
#include "util/utf8.h"
#include "weightlift/safetensors.h"

namespace wl {

namespace {
std::string json_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
}

// A dtype's place in safetensors' Dtype enum, whose order its writer sorts by
// (ours differs only in where the FNUZ float8 kinds sit).
int safetensors_rank(DType t) {
  switch (t) {
    case DType::F8_E4M3FNUZ: return static_cast<int>(DType::F8_E8M0) * 4 + 1;
    case DType::F8_E5M2FNUZ: return static_cast<int>(DType::F8_E8M0) * 4 + 2;
    default: return static_cast<int>(t) * 4;
  }
}

// Tensors smaller than this are gathered into one buffer and written
// together (one write for thousands of small tensors); larger ones go
// straight from their memory.
constexpr size_t kGatherBytes = 1 << 20;
}  // namespace

Result<SafetensorsLayout> plan_safetensors(std::span<const NamedTensor> tensors,
                                           const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout L;
  std::set<std::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (!is_valid_utf8(t.name)) return Status::InvalidArgument("tensor name is not valid UTF-8").with_tensor(t.name);
    if (t.name == "__metadata__") return Status::InvalidArgument("'__metadata__' is reserved").with_tensor(t.name);
    if (!names.insert(t.name).second) return Status::InvalidArgument("duplicate tensor name").with_tensor(t.name);
    if (!dtype_in_safetensors(t.view.dtype()))
      return Status::InvalidArgument(
                 fmt::format("dtype {} cannot be stored in safetensors", dtype_name(t.view.dtype())))
          .with_tensor(t.name);
    uint64_t numel = 0;
    if (!checked_numel(t.view.shape(), &numel))
      return Status::InvalidArgument(fmt::format("invalid shape {}", shape_to_string(t.view.shape())))
          .with_tensor(t.name);
    auto nb = dtype_nbytes(t.view.dtype(), numel);
    if (!nb || *nb != t.view.nbytes())
      return Status::InvalidArgument(fmt::format("holds {} bytes but shape {} of {} needs {}", t.view.nbytes(),
                                                 shape_to_string(t.view.shape()), dtype_name(t.view.dtype()),
                                                 nb ? *nb : 0))
          .with_tensor(t.name);
  }
  for (auto& [k, v] : metadata)
    if (!is_valid_utf8(k) || !is_valid_utf8(v)) return Status::InvalidArgument("metadata is not valid UTF-8");

  L.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) L.order[i] = i;
  // safetensors' order: larger alignment (later Dtype) first, then by name.
  std::stable_sort(L.order.begin(), L.order.end(), [&](size_t a, size_t b) {
    int da = safetensors_rank(tensors[a].view.dtype()), db = safetensors_rank(tensors[b].view.dtype());
    if (da != db) return da > db;
    return tensors[a].name < tensors[b].name;
  });

  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool f2 = true;
    for (auto& [k, v] : metadata) {
      if (!f2) header += ',';
      f2 = false;
      header += json_string(k) + ":" + json_string(v);
    }
    header += "}";
    first = false;
  }
  L.begin.assign(tensors.size(), 0);
  uint64_t cursor = 0;
  for (size_t idx : L.order) {
    const auto& t = tensors[idx];
    if (!first) header += ',';
    first = false;
    uint64_t e = cursor + t.view.nbytes();
    header += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", json_string(t.name),
                          dtype_name(t.view.dtype()), fmt::join(t.view.shape(), ","), cursor, e);
    L.begin[idx] = cursor;
    cursor = e;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  L.prefix.resize(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) L.prefix[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  L.prefix += header;
  L.total_size = L.prefix.size() + cursor;
  return L;
}

Status write_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                         const std::map<std::string, std::string>& metadata, Env* env, bool sync) {
  WL_ASSIGN_OR_RETURN(SafetensorsLayout L, plan_safetensors(tensors, metadata));
  WL_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path, 0644, env));
  std::string gather = std::move(L.prefix);
  auto flush = [&]() -> Status {
    Status s = out.append(gather);
    gather.clear();
    return s;
  };
  for (size_t idx : L.order) {
    auto b = tensors[idx].view.bytes();
    if (b.size() < kGatherBytes) {
      gather.append(reinterpret_cast<const char*>(b.data()), b.size());
      if (gather.size() >= kGatherBytes) WL_RETURN_IF_ERROR(flush());
      continue;
    }
    if (!gather.empty()) WL_RETURN_IF_ERROR(flush());
    WL_RETURN_IF_ERROR(out.append(b));
  }
  if (!gather.empty()) WL_RETURN_IF_ERROR(flush());
  return out.commit(sync);
}

Result<std::string> serialize_safetensors(std::span<const NamedTensor> tensors,
                                          const std::map<std::string, std::string>& metadata) {
  WL_ASSIGN_OR_RETURN(SafetensorsLayout L, plan_safetensors(tensors, metadata));
  std::string out = std::move(L.prefix);
  out.reserve(L.total_size);
  for (size_t idx : L.order) {
    auto b = tensors[idx].view.bytes();
    if (!b.empty()) out.append(reinterpret_cast<const char*>(b.data()), b.size());
  }
  return out;
}

}  // namespace wl

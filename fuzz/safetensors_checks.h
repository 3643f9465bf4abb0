// Shared by the safetensors fuzz targets: open a file every way the library
// can, and check what a successful open promises.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "mem_env.h"
#include "weightlift/safetensors.h"

namespace wl::fuzz {

inline void check_error(const Status& s, const std::string& path) {
  WL_FUZZ_CHECK(!s.ok());
  WL_FUZZ_CHECK(!s.message().empty());
  WL_FUZZ_CHECK(s.file() == path);
}

inline void check_header(const SafetensorsHeader& h, uint64_t file_size) {
  uint64_t cursor = h.data_start;
  for (const auto& t : h.tensors) {
    WL_FUZZ_CHECK(t.offset == cursor);  // tiles the data area
    WL_FUZZ_CHECK(t.offset <= file_size && t.nbytes <= file_size - t.offset);
    cursor = t.offset + t.nbytes;
  }
  WL_FUZZ_CHECK(cursor == file_size);
}

// Opens `bytes` as a safetensors file in every mode and reads what it holds.
inline void exercise_safetensors_file(const std::string& bytes) {
  static const std::string kPath = "/fuzz/model.safetensors";
  for (int variant = 0; variant < 3; ++variant) {
    const bool mappable = variant != 1;
    const FileMode mode = variant == 2 ? FileMode::kPread : FileMode::kMmap;
    auto file = std::make_shared<MemFile>(kPath, bytes, mappable);
    auto sf = SafetensorsFile::open(file, mode);
    if (!sf.ok()) {
      check_error(sf.status(), kPath);
      continue;
    }
    const auto& f = **sf;
    check_header(f.header(), bytes.size());
    WL_FUZZ_CHECK(f.names().size() == f.tensors().size());
    size_t checked = 0;
    for (const auto& t : f.tensors()) {
      if (++checked > 16) break;  // a million-tensor header stays fast
      WL_FUZZ_CHECK(f.find(t.name) == &t);
      auto v = f.get(t.name);
      WL_FUZZ_CHECK(v.ok());
      WL_FUZZ_CHECK(v->bytes().size() == t.nbytes);
      if (t.nbytes) WL_FUZZ_CHECK(std::memcmp(v->bytes().data(), bytes.data() + t.offset, t.nbytes) == 0);
      if (t.nbytes <= (1u << 20)) {
        auto r = f.read(t.name);
        WL_FUZZ_CHECK(r.ok());
        WL_FUZZ_CHECK(r->nbytes() == t.nbytes);
      }
      auto rows = f.read_slice(t.name, 0, 1, 3);
      if (t.shape.empty()) {
        WL_FUZZ_CHECK(!rows.ok());
      } else if (rows.ok()) {
        WL_FUZZ_CHECK(rows->nbytes() <= t.nbytes);
      }
    }
    WL_FUZZ_CHECK(!f.get("\x01no such tensor").ok());
  }
}

}  // namespace wl::fuzz

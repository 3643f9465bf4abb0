// Fuzzes the PyTorch checkpoint reader: the zip archive (zip64 included), the
// legacy stream and the restricted unpickler, on raw file bytes held in
// memory. Every tensor it lists must be readable within the file, or fail
// with an error naming the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "mem_env.h"
#include "weightlift/torch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wl;
  static const std::string kPath = "/fuzz/model.pt";
  for (bool mappable : {true, false}) {
    fuzz::MemEnv env;
    env.mappable = mappable;
    env.dirs = {"/fuzz"};
    env.files[kPath] = std::string(reinterpret_cast<const char*>(data), size);
    auto ck = TorchCheckpoint::open(kPath, &env);
    if (!ck.ok()) {
      WL_FUZZ_CHECK(!ck.status().message().empty());
      WL_FUZZ_CHECK(ck.status().file() == kPath);
      continue;
    }
    const auto& c = **ck;
    for (const auto& s : c.storages()) WL_FUZZ_CHECK(s.file_offset <= size && s.nbytes <= size - s.file_offset);
    size_t n = 0;
    for (size_t i = 0; i < c.tensors().size() && n < 32; ++i, ++n) {
      const auto& info = c.tensors()[i];
      if (info.nbytes > (64u << 20)) continue;  // a huge strided view of a small storage: skip the copy
      auto v = c.view(i);
      if (v.ok()) WL_FUZZ_CHECK(v->nbytes() == info.nbytes);
      auto r = c.read(i);
      if (r.ok()) WL_FUZZ_CHECK(r->nbytes() == info.nbytes);
    }
    for (size_t s = 0; s < c.storages().size() && s < 32; ++s) (void)c.storage_bytes(s);
  }
  return 0;
}

// Fuzzes the .npy header parser (magic, version, header length, the Python
// dict literal) and the reader over an in-memory file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "mem_env.h"
#include "weightlift/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wl;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto h = parse_npy_header(bytes, size, "f.npy");
  if (h.ok()) {
    WL_FUZZ_CHECK(h->data_offset <= size && h->nbytes <= size - h->data_offset);
  } else {
    WL_FUZZ_CHECK(!h.status().message().empty());
  }
  fuzz::MemEnv env;
  env.dirs = {"/fuzz"};
  env.files["/fuzz/f.npy"] = std::string(bytes);
  auto t = read_npy("/fuzz/f.npy", &env);
  if (t.ok() && h.ok()) WL_FUZZ_CHECK(t->nbytes() == h->nbytes);
  return 0;
}

// Fuzzes SafetensorsFile::open on raw file bytes (length prefix included),
// mapped, read with pread, and read eagerly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "safetensors_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wl::fuzz::exercise_safetensors_file(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}

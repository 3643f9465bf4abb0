// Fuzzes the safetensors header parser. Input: two bytes giving the size of
// the data area (little-endian, modulo 16 KiB: bigger tensors add no
// coverage, only time), then the header JSON. The target builds the
// file (length prefix + header + data) so that mutations reach the JSON
// checks instead of dying on the length prefix. A header that parses must
// repeat no key (util/json_strict.h agrees), whichever parser read it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "safetensors_checks.h"
#include "util/json_strict.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wl;
  if (size < 2) return 0;
  const uint64_t data_size = (uint64_t{data[0]} | (uint64_t{data[1]} << 8)) & 0x3fff;
  std::string_view json(reinterpret_cast<const char*>(data) + 2, size - 2);
  const uint64_t file_size = 8 + json.size() + data_size;

  auto h = parse_safetensors_header(json, file_size, "h.safetensors");
  if (h.ok()) {
    fuzz::check_header(*h, file_size);
  } else {
    fuzz::check_error(h.status(), "h.safetensors");
  }
  // One reading: a header that parses repeats no key at any level (both of
  // the reader's parsers agree with the strict JSON reader), and a header
  // that repeats one never parses.
  std::string why;
  auto strict = parse_json_strict(json, &why);
  if (h.ok()) WL_FUZZ_CHECK(strict.has_value());
  if (!strict && why.find("duplicate key") != std::string::npos) WL_FUZZ_CHECK(!h.ok());

  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  file.append(json);
  file.resize(file.size() + data_size);
  for (uint64_t i = 0; i < data_size; ++i) file[8 + json.size() + i] = static_cast<char>(i * 31 + 7);
  fuzz::exercise_safetensors_file(file);
  return 0;
}

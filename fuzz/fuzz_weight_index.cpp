// Fuzzes model.safetensors.index.json handling (filter_duplicate_safetensors_files,
// find_weight_files) over an in-memory folder, and checks that natural_less,
// which sorts shard names, is a strict weak order on pieces of the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mem_env.h"
#include "weightlift/weight_files.h"

namespace {

void check_natural_order(std::string_view input) {
  // Three names: the input split at its first two newlines.
  std::string_view parts[3];
  for (int i = 0; i < 2; ++i) {
    size_t nl = input.find('\n');
    parts[i] = input.substr(0, nl);
    input = nl == std::string_view::npos ? std::string_view() : input.substr(nl + 1);
  }
  parts[2] = input.substr(0, 256);
  for (auto& a : parts) {
    WL_FUZZ_CHECK(!wl::natural_less(a, a));
    for (auto& b : parts) {
      WL_FUZZ_CHECK(!(wl::natural_less(a, b) && wl::natural_less(b, a)));
      for (auto& c : parts) {
        if (wl::natural_less(a, b) && wl::natural_less(b, c)) WL_FUZZ_CHECK(wl::natural_less(a, c));
        // incomparability is transitive too
        auto eq = [](std::string_view x, std::string_view y) { return !wl::natural_less(x, y) && !wl::natural_less(y, x); };
        if (eq(a, b) && eq(b, c)) WL_FUZZ_CHECK(eq(a, c));
      }
    }
  }
  std::vector<std::string> names(std::begin(parts), std::end(parts));
  wl::natural_sort(names);
  auto base = [](const std::string& p) {  // natural_sort orders by base name
    auto pos = p.rfind('/');
    return pos == std::string::npos ? std::string_view(p) : std::string_view(p).substr(pos + 1);
  };
  WL_FUZZ_CHECK(std::is_sorted(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    return wl::natural_less(base(a), base(b));
  }));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wl;
  std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::MemEnv env;
  env.dirs = {"/m"};
  const std::vector<std::string> shards = {"/m/model-00001-of-00002.safetensors", "/m/model-00002-of-00002.safetensors",
                                           "/m/model.safetensors"};
  for (auto& s : shards) env.files[s] = "";
  env.files["/m/model.safetensors.index.json"] = text;

  auto kept = filter_duplicate_safetensors_files(shards, "/m", kSafetensorsIndexName, &env);
  if (kept.ok()) {
    for (auto& k : *kept) WL_FUZZ_CHECK(std::find(shards.begin(), shards.end(), k) != shards.end());
  } else {
    WL_FUZZ_CHECK(kept.status().file() == "/m/model.safetensors.index.json");
    WL_FUZZ_CHECK(!kept.status().message().empty());
  }
  auto wf = find_weight_files("/m", &env);
  if (wf.ok()) {
    WL_FUZZ_CHECK(!wf->files.empty());
    for (auto& f : wf->files) WL_FUZZ_CHECK(env.files.count(f));
  } else {
    WL_FUZZ_CHECK(!wf.status().message().empty());
  }
  check_natural_order(text);
  return 0;
}

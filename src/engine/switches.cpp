// The one place under src/engine and src/gpu that reads the environment
// (switches.h lists every variable and who weighs it).
#include "weightlift/switches.h"

#include <cstdlib>
#include <string_view>

namespace wl {

namespace {

// The variable's value; nullptr when it is unset or empty.
const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

Switches read_switches() {
  Switches s;
  if (const char* v = value_of("WEIGHTLIFT_H2D_SOURCE")) s.h2d_source = v;
  if (const char* v = value_of("WEIGHTLIFT_DEVICE_STRATEGY")) s.device_strategy_asked = std::string_view(v) == "asked";
  if (const char* v = value_of("WEIGHTLIFT_GDS_AUTO")) s.gds_auto_trusts_cufile = std::string_view(v) == "cufile";
  if (const char* v = value_of("WEIGHTLIFT_CALLER_HUGE_PAGES")) s.caller_huge_pages = std::string_view(v) == "1";
  if (const char* v = value_of("WEIGHTLIFT_GPU_BACKEND")) s.gpu_backend = v;
  if (const char* v = value_of("WEIGHTLIFT_FAKE_GPUS")) s.fake_gpus = std::atoi(v);
  if (const char* v = value_of("WEIGHTLIFT_CUDART")) s.cudart = v;
  if (const char* v = value_of("WEIGHTLIFT_GPU_WARMUP")) s.gpu_warm_up = std::string_view(v) != "0";
  if (const char* v = value_of("WEIGHTLIFT_PINNED_RING")) s.pinned_ring = v;
  if (const char* v = value_of("WEIGHTLIFT_RING_GROW")) s.ring_grow = std::string_view(v) != "0";
  if (const char* v = value_of("CUFILE_ENV_PATH_JSON")) s.cufile_config = v;
  return s;
}

}  // namespace wl

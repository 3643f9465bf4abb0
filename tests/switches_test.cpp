// switches.h: every environment variable of the engine and the GPU path,
// read in one place; a load's options carry the read path's switches as the
// environment set them when the options were made.
#include <gtest/gtest.h>

#include "test_util.h"
#include "weightlift/load_options.h"
#include "weightlift/switches.h"

namespace wl {
namespace {

using testing::ScopedEnv;

TEST(Switches, DefaultsWhenUnset) {
  const char* names[] = {"WEIGHTLIFT_H2D_SOURCE",  "WEIGHTLIFT_DEVICE_STRATEGY",  "WEIGHTLIFT_GDS_AUTO",
                         "WEIGHTLIFT_GPU_BACKEND", "WEIGHTLIFT_FAKE_GPUS",        "WEIGHTLIFT_CUDART",
                         "WEIGHTLIFT_GPU_WARMUP",  "WEIGHTLIFT_PINNED_RING",      "WEIGHTLIFT_RING_GROW",
                         "CUFILE_ENV_PATH_JSON",   "WEIGHTLIFT_CALLER_HUGE_PAGES"};
  std::vector<std::unique_ptr<ScopedEnv>> unset;
  for (const char* n : names) unset.push_back(std::make_unique<ScopedEnv>(n, nullptr));
  Switches s = read_switches();
  EXPECT_EQ(s.h2d_source, "auto");
  EXPECT_FALSE(s.device_strategy_asked);
  EXPECT_FALSE(s.gds_auto_trusts_cufile);
  EXPECT_EQ(s.gpu_backend, "");
  EXPECT_FALSE(s.fake_gpus.has_value());
  EXPECT_EQ(s.cudart, "");
  EXPECT_TRUE(s.gpu_warm_up);
  EXPECT_EQ(s.pinned_ring, "");
  EXPECT_TRUE(s.ring_grow);
  EXPECT_EQ(s.cufile_config, "/etc/cufile.json");
  EXPECT_FALSE(s.caller_huge_pages);
}

TEST(Switches, EachVariableIsRead) {
  ScopedEnv a("WEIGHTLIFT_H2D_SOURCE", "mapped"), b("WEIGHTLIFT_DEVICE_STRATEGY", "asked"),
      c("WEIGHTLIFT_GDS_AUTO", "cufile"), d("WEIGHTLIFT_GPU_BACKEND", "fake"), e("WEIGHTLIFT_FAKE_GPUS", "0"),
      f("WEIGHTLIFT_CUDART", "/x/libcudart.so"), g("WEIGHTLIFT_GPU_WARMUP", "0"), h("WEIGHTLIFT_PINNED_RING", "4x1MiB"),
      i("WEIGHTLIFT_RING_GROW", "0"), j("CUFILE_ENV_PATH_JSON", "/x/cufile.json"),
      k("WEIGHTLIFT_CALLER_HUGE_PAGES", "1");
  Switches s = read_switches();
  EXPECT_EQ(s.h2d_source, "mapped");
  EXPECT_TRUE(s.device_strategy_asked);
  EXPECT_TRUE(s.gds_auto_trusts_cufile);
  EXPECT_EQ(s.gpu_backend, "fake");
  EXPECT_EQ(s.fake_gpus, 0);  // set to 0: no device, not the default
  EXPECT_EQ(s.cudart, "/x/libcudart.so");
  EXPECT_FALSE(s.gpu_warm_up);
  EXPECT_EQ(s.pinned_ring, "4x1MiB");
  EXPECT_FALSE(s.ring_grow);
  EXPECT_EQ(s.cufile_config, "/x/cufile.json");
  EXPECT_TRUE(s.caller_huge_pages);
  // Values are kept as given: the rule that needs one refuses it (read_path_test, gpu_device_test).
  ScopedEnv bad("WEIGHTLIFT_H2D_SOURCE", "sometimes");
  EXPECT_EQ(read_switches().h2d_source, "sometimes");
}

TEST(Switches, OptionsCarryThemFromWhenTheyWereMade) {
  std::optional<LoadOptions> before;
  {
    ScopedEnv asked("WEIGHTLIFT_DEVICE_STRATEGY", "asked");
    before.emplace();
  }
  ScopedEnv other("WEIGHTLIFT_DEVICE_STRATEGY", "stream");
  LoadOptions after;
  EXPECT_TRUE(before->switches.device_strategy_asked);  // read once, into the options
  EXPECT_FALSE(after.switches.device_strategy_asked);
}

}  // namespace
}  // namespace wl

// weightlift/switches.h: every environment variable the engine and the GPU
// path read, read in one place (src/engine/switches.cpp; no other file under
// src/engine or src/gpu calls getenv, scripts/lint checks it).
//
// Two kinds:
//   the read path's A/B switches   read into LoadOptions::switches when the
//                                  options are made; choose() weighs them
//                                  with the rest of the request (read_path.h),
//                                  so a load decides with the values its
//                                  options carry, never with a variable read
//                                  again halfway through
//   the GPU path's settings        read when the backend, its ring or cuFile
//                                  is set up (gpu.h), once per process, or
//                                  when a CUDA destination is made
// Values are kept as given: a bad one is refused, naming the variable, by the
// rule that needs it (a CPU load never looks at WEIGHTLIFT_H2D_SOURCE).
// Threading: read_switches() may be called from any thread.
#pragma once

#include <optional>
#include <string>

namespace wl {

struct Switches {
  // ---- the read path's (choose(), read_path.h) ----
  // WEIGHTLIFT_H2D_SOURCE: where a stream's copies into device memory read
  // from: "auto" (default), "slot" (every chunk read into a pinned ring slot)
  // or "mapped" (straight out of the registered page cache).
  std::string h2d_source = "auto";
  // WEIGHTLIFT_DEVICE_STRATEGY=asked: a per-file strategy into device memory
  // runs as asked instead of as the stream.
  bool device_strategy_asked = false;

  // ---- the caller's memory (destination.h) ----
  // WEIGHTLIFT_CALLER_HUGE_PAGES=1: the caller's host regions are advised for
  // transparent huge pages before the engine writes them (read once per process).
  bool caller_huge_pages = false;

  // ---- the GPU path's (gpu.h) ----
  // WEIGHTLIFT_GDS_AUTO=cufile: a CUDA destination made with gds=auto takes
  // whatever cuFile accepts (its compatibility mode too) instead of asking
  // the platform first (read when the destination is made).
  bool gds_auto_trusts_cufile = false;
  std::string gpu_backend;       // WEIGHTLIFT_GPU_BACKEND: "" / "cuda" / "auto", or "fake"
  std::optional<int> fake_gpus;  // WEIGHTLIFT_FAKE_GPUS: the fake backend's devices (unset: its default)
  std::string cudart;            // WEIGHTLIFT_CUDART: a CUDA runtime library to load
  bool gpu_warm_up = true;       // WEIGHTLIFT_GPU_WARMUP=0 turns gpu::warm_up() off
  std::string pinned_ring;       // WEIGHTLIFT_PINNED_RING: "SLOTSxSIZE[xSTREAMS]" ("": the machine's)
  bool ring_grow = true;         // WEIGHTLIFT_RING_GROW=0: every ring slot pinned before the first load
  // CUFILE_ENV_PATH_JSON: cuFile's configuration file (GPUDirect Storage's platform check)
  std::string cufile_config = "/etc/cufile.json";
};

// The switches as the environment sets them now (unset: the defaults above).
Switches read_switches();

}  // namespace wl

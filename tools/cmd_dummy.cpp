// weightlift dummy MODEL [--low L] [--high H] [--seed N] [--threads T] [--device cpu|cuda] [--hash]
// Fills every tensor of a model with dummy weights, reading only the headers
// (vLLM initialize_dummy_weights), and reports the time taken. --hash prints a
// SHA-256 over all filled bytes in file and tensor order, which is the same
// for any thread count and for both devices.
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "command.h"
#include "weightlift/checkpoint.h"
#include "weightlift/dummy.h"
#include "weightlift/gpu.h"
#include "weightlift/hash.h"
#include "weightlift/weight_files.h"

namespace wl::cli {
namespace {

struct DummyArgs {
  std::string model;
  DummyOptions options;
  std::string device = "cpu";
  bool hash = false;
};

int run_dummy(const DummyArgs& a) {
  auto wf = find_weight_files(a.model);
  if (!wf.ok()) return fail(wf.status());
  if (a.device == "cuda" && gpu::device_count() == 0) return fail(Status::Unavailable(gpu::unavailable_reason()));
  Sha256 sha;
  uint64_t tensors = 0, bytes = 0, skipped = 0;
  double seconds = 0;
  for (const auto& f : wf->files) {
    auto ck = open_checkpoint(f);
    if (!ck.ok()) return fail(ck.status());
    for (const auto& t : (*ck)->tensors()) {
      uint64_t numel = shape_numel(t.shape);
      if (!dummy_fills(t.dtype)) ++skipped;
      if (a.device == "cuda") {
        auto buf = gpu::DeviceBuffer::allocate(t.nbytes);
        if (!buf.ok()) return fail(std::move(buf).status().with_tensor(t.name).with_file(f));
        auto start = std::chrono::steady_clock::now();
        Status st = gpu::fill_dummy_device(t.dtype, *buf, numel, a.options);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!st.ok()) return fail(std::move(st).with_tensor(t.name).with_file(f));
        if (a.hash) {
          auto host = Tensor::empty(t.dtype, t.shape);
          if (!host.ok()) return fail(host.status());
          if (Status c = buf->copy_to_host(host->mutable_bytes()); !c.ok()) return fail(c);
          sha.update(host->bytes());
        }
      } else {
        auto start = std::chrono::steady_clock::now();
        auto host = dummy_tensor(t.dtype, t.shape, a.options);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!host.ok()) return fail(std::move(host).status().with_tensor(t.name).with_file(f));
        if (a.hash) sha.update(host->bytes());
      }
      ++tensors;
      bytes += t.nbytes;
    }
  }
  std::printf("%llu tensors, %llu bytes filled on %s in %.3f s (%.2f GB/s); %llu non-float tensors left as zeros\n",
              static_cast<unsigned long long>(tensors), static_cast<unsigned long long>(bytes), a.device.c_str(),
              seconds, seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0,
              static_cast<unsigned long long>(skipped));
  if (a.hash) std::printf("sha256 %s\n", sha.hex_digest().c_str());
  return 0;
}

RunFn setup_dummy(CLI::App& sub) {
  auto a = std::make_shared<DummyArgs>();
  sub.add_option("model", a->model, "model folder or weight file")->required();
  sub.add_option("--low", a->options.low, "lower bound (default -1e-3)");
  sub.add_option("--high", a->options.high, "upper bound, exclusive (default 1e-3)");
  sub.add_option("--seed", a->options.seed, "seed, the same for every tensor (default 1234)");
  sub.add_option("--threads", a->options.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  sub.add_option("--device", a->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  sub.add_flag("--hash", a->hash, "print a SHA-256 of all the filled bytes");
  return [a] { return run_dummy(*a); };
}

Register reg("dummy", "Fill a model's tensors with deterministic dummy weights (headers only)", setup_dummy);

}  // namespace
}  // namespace wl::cli

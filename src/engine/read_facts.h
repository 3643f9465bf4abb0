// Private: the facts choose() consults during a load, found out from the plan
// (the planned version of each file, which tensors lie contiguously) and the
// destination (GPUDirect Storage), each at most once.
#pragma once

#include <optional>

#include "engine/plan.h"
#include "weightlift/load_options.h"
#include "weightlift/read_path.h"

namespace wl {

// The mean residency (RandomAccessFile::cached_fraction) of the first files
// that can tell, opened by `open(i)`; nullopt when none can.
constexpr size_t kSampledFiles = 8;
template <class OpenFn>
Result<std::optional<double>> sample_residency(size_t files, OpenFn open) {
  double hits = 0;
  int n = 0;
  for (size_t fi = 0; fi < files && fi < kSampledFiles; ++fi) {
    WL_ASSIGN_OR_RETURN(std::shared_ptr<RandomAccessFile> f, open(fi));
    double r = f->cached_fraction();
    if (r >= 0) hits += r, ++n;
  }
  if (n == 0) return std::optional<double>();
  return std::optional<double>(hits / n);
}

}  // namespace wl

namespace wl::engine {

class PlanFacts final : public ReadFacts {
 public:
  PlanFacts(const Plan& plan, const std::vector<std::string>& files, const LoadOptions& o, Destination* dest)
      : plan_(plan), files_(files), o_(o), dest_(dest) {}
  Result<std::optional<double>> cached_fraction() override;
  std::string fs_type() override;
  Result<uint64_t> checkpoint_bytes() override;
  Result<uint64_t> available_memory() override;
  std::optional<bool> contiguous() override;
  Result<bool> gds_usable(std::string* why) override;

 private:
  const Plan& plan_;
  const std::vector<std::string>& files_;
  const LoadOptions& o_;
  Destination* dest_;
};

}  // namespace wl::engine

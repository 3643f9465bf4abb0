// Private: what choose() is asked during plan_load(): the request of a
// load's options (read_request, load_options.h) and the facts of its planned
// files and destination (PlanFacts), each found out at most once; decide()
// is the one call of choose().
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

// The request of a load (read_path.h): the source from the files (a URL, or
// files a source is still writing: Env::arriving()), the destination and its
// GDS wish, the caller's wishes and the switches from the options.
ReadRequest read_request(const std::vector<std::string>& files, const LoadOptions& options);

}  // namespace wl

namespace wl::engine {

class PlanFacts final : public ReadFacts {
 public:
  PlanFacts(const Plan& plan, const std::vector<std::string>& files, const LoadOptions& o)
      : plan_(plan), files_(files), o_(o) {}
  Result<std::optional<double>> cached_fraction() override;
  std::string fs_type() override;
  Result<uint64_t> checkpoint_bytes() override;
  Result<uint64_t> available_memory() override;
  std::optional<bool> contiguous() override;
  Result<bool> gds_usable(std::string* why) override;
  std::optional<UploaderFacts> uploader() override;
  uint64_t stream_bytes() override;

 private:
  const Plan& plan_;
  const std::vector<std::string>& files_;
  const LoadOptions& o_;
};

// The read path of a planned load: choose() over the request of `o`, the
// facts of `plan` and its destination, and those the caller holds
// (LoadOptions::known); with `read_ahead`, a read-ahead's sizes too. The one
// place the engine calls choose().
Result<ReadPath> decide(const std::vector<std::string>& files, const LoadOptions& o, const Plan& plan,
                        bool read_ahead = false);

}  // namespace wl::engine

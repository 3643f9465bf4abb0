// The read-path vocabulary: the modes' names, the facts of a list of files
// (file_facts) and facts given by the caller (GivenFacts).
#include <thread>

#include "engine/read_facts.h"
#include "weightlift/prefetch.h"

namespace wl {

std::optional<Strategy> strategy_from_name(std::string_view name) {
  if (name == "lazy") return Strategy::kLazy;
  if (name == "eager") return Strategy::kEager;
  if (name == "prefetch") return Strategy::kPrefetch;
  if (name == "auto") return Strategy::kAuto;
  if (name == "threads") return Strategy::kThreads;
  if (name == "stream") return Strategy::kStream;
  return std::nullopt;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::kLazy: return "lazy";
    case Strategy::kEager: return "eager";
    case Strategy::kPrefetch: return "prefetch";
    case Strategy::kAuto: return "auto";
    case Strategy::kThreads: return "threads";
    case Strategy::kStream: return "stream";
  }
  return "?";
}

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (Strategy s : {Strategy::kLazy, Strategy::kEager, Strategy::kPrefetch, Strategy::kAuto, Strategy::kThreads,
                       Strategy::kStream})
      v.emplace_back(strategy_name(s));
    return v;
  }();
  return names;
}

std::optional<Toggle> toggle_from_name(std::string_view name) {
  if (name == "auto") return Toggle::kAuto;
  if (name == "on") return Toggle::kOn;
  if (name == "off") return Toggle::kOff;
  return std::nullopt;
}

std::string_view toggle_name(Toggle t) {
  switch (t) {
    case Toggle::kAuto: return "auto";
    case Toggle::kOn: return "on";
    case Toggle::kOff: return "off";
  }
  return "?";
}

namespace {

class FileFacts final : public ReadFacts {
 public:
  FileFacts(std::vector<std::string> files, Env* env, SystemInfo* sys)
      : files_(std::move(files)), env_(env), sys_(sys) {}
  Result<std::optional<double>> cached_fraction() override {
    if (!files_.empty() && is_url(files_[0])) return std::optional<double>();
    return sample_residency(files_.size(),
                            [&](size_t fi) { return env_->open(files_[fi], {.mode = FileMode::kPread}); });
  }
  std::string fs_type() override { return files_.empty() ? std::string() : filesystem_type(files_[0], sys_); }
  Result<uint64_t> checkpoint_bytes() override { return checkpoint_size_bytes(files_, env_); }
  Result<uint64_t> available_memory() override { return available_ram_bytes(sys_); }
  std::optional<bool> contiguous() override { return std::nullopt; }
  Result<bool> gds_usable(std::string* why) override {
    *why = "no device destination";
    return false;
  }

 private:
  std::vector<std::string> files_;
  Env* env_;
  SystemInfo* sys_;
};

}  // namespace

std::unique_ptr<ReadFacts> file_facts(const std::vector<std::string>& files, Env* env, SystemInfo* system) {
  return std::make_unique<FileFacts>(files, env, system);
}

unsigned ReadFacts::cores() { return std::thread::hardware_concurrency(); }

// ---- GivenFacts ----

Result<std::optional<double>> GivenFacts::cached_fraction() {
  if (cached) return *cached;
  return rest_ ? rest_->cached_fraction() : std::optional<double>();
}
std::string GivenFacts::fs_type() {
  if (fstype) return *fstype;
  return rest_ ? rest_->fs_type() : std::string();
}
Result<uint64_t> GivenFacts::checkpoint_bytes() {
  if (bytes) return *bytes;
  return rest_ ? rest_->checkpoint_bytes() : Status::Unavailable("the checkpoint's size is not known");
}
Result<uint64_t> GivenFacts::available_memory() {
  if (available) return *available;
  return rest_ ? rest_->available_memory() : Status::Unavailable("the available memory is not known");
}
std::optional<bool> GivenFacts::contiguous() {
  if (whole) return whole;
  return rest_ ? rest_->contiguous() : std::nullopt;
}
unsigned GivenFacts::cores() { return rest_ ? rest_->cores() : ReadFacts::cores(); }
std::optional<UploaderFacts> GivenFacts::uploader() { return rest_ ? rest_->uploader() : std::nullopt; }
uint64_t GivenFacts::stream_bytes() { return rest_ ? rest_->stream_bytes() : 0; }

Result<bool> GivenFacts::gds_usable(std::string* why) {
  if (gds_refusal) {
    *why = *gds_refusal;
    return gds_refusal->empty();
  }
  if (rest_) return rest_->gds_usable(why);
  *why = "not known to be usable";
  return false;
}

}  // namespace wl

// The names of the load options' modes.
#include "weightlift/load_options.h"

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

}  // namespace wl

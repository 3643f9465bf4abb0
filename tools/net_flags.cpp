// The network flags of the commands that reach servers (load, ls, download):
// each sets the WEIGHTLIFT_* variable of the same name (a flag wins over the
// environment), read by every HTTP client the command builds (http.h).
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

#include "command.h"
#include "weightlift/http.h"

namespace wl::cli {

void add_network_flags(CLI::App& sub, NetworkFlags& f) {
  sub.add_option("--connect-timeout", f.connect_timeout,
                 "seconds to open a connection (default 10; WEIGHTLIFT_CONNECT_TIMEOUT)");
  sub.add_option(
      "--stall-timeout", f.stall_timeout,
      "seconds a transfer may stay under 1 KiB/s before it is aborted (default 10; WEIGHTLIFT_STALL_TIMEOUT)");
  sub.add_option("--retries", f.retries, "tries after the first for a failed request (default 4; WEIGHTLIFT_RETRIES)");
  sub.add_option("--request-timeout", f.request_timeout,
                 "seconds for one request, all its tries and resumes (default none; WEIGHTLIFT_REQUEST_TIMEOUT)");
  sub.add_option("--deadline", f.deadline,
                 "seconds for every request of the command together (default none; WEIGHTLIFT_DEADLINE)");
}

Result<std::unique_ptr<ScopedNetworkDeadline>> apply_network_flags(const NetworkFlags& f) {
  const std::pair<const char*, const std::string*> flags[] = {{"WEIGHTLIFT_CONNECT_TIMEOUT", &f.connect_timeout},
                                                              {"WEIGHTLIFT_STALL_TIMEOUT", &f.stall_timeout},
                                                              {"WEIGHTLIFT_RETRIES", &f.retries},
                                                              {"WEIGHTLIFT_REQUEST_TIMEOUT", &f.request_timeout}};
  for (const auto& [name, value] : flags)
    if (!value->empty()) ::setenv(name, value->c_str(), 1);  // before any thread or client exists
  HttpOptions check;  // every setting parsed now, so that a bad one is a usage error before any work
  if (!check.invalid.empty()) {
    std::string msg = check.invalid;
    for (const auto& flag : flags) {
      if (flag.second->empty() || !msg.starts_with(flag.first)) continue;
      std::string option = std::string(flag.first).substr(11);  // after "WEIGHTLIFT_"
      for (auto& c : option) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      msg += " (from --" + option + ")";
    }
    return Status::InvalidArgument(msg);
  }
  std::string deadline = f.deadline, setting = "--deadline";
  if (deadline.empty()) {
    const char* env = std::getenv("WEIGHTLIFT_DEADLINE");
    if (env && *env) deadline = env, setting = "WEIGHTLIFT_DEADLINE";
  }
  if (deadline.empty()) return std::unique_ptr<ScopedNetworkDeadline>();
  char* end = nullptr;
  const double s = std::strtod(deadline.c_str(), &end);
  if (end == deadline.c_str() || *end != '\0' || !(s > 0) || s > 7 * 24 * 3600)
    return Status::InvalidArgument(fmt::format("{}='{}' is not a positive number of seconds", setting, deadline));
  return std::make_unique<ScopedNetworkDeadline>(s, setting);
}

}  // namespace wl::cli

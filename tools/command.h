// The CLI's command registry: each tools/cmd_<name>.cpp registers itself, so
// adding a command touches no other file.
#pragma once

#include <memory>

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "weightlift/hub.h"
#include "weightlift/status.h"
#include "weightlift/text.h"

namespace wl::cli {

// Declares the command's options on `sub` and returns the function that runs
// it (its exit code) once the command line has been parsed.
using RunFn = std::function<int()>;
using SetupFn = RunFn (*)(CLI::App& sub);

struct Command {
  std::string name;
  std::string help;
  SetupFn setup;
};

std::vector<Command>& registry();

struct Register {
  Register(const char* name, const char* help, SetupFn setup) { registry().push_back({name, help, setup}); }
};

// The weight files of each PATH (a file, a model folder, or a Hub repository
// id, downloaded or found offline), in order. With `sources`, a repository id
// is not downloaded first: its weights are served while they download
// (hub.h's HubSource, kept alive in *sources for the caller's load).
Result<std::vector<std::string>> weight_files_of(const std::vector<std::string>& paths, const std::string& revision,
                                                 bool offline,
                                                 std::vector<std::unique_ptr<HubSource>>* sources = nullptr);

// --connect-timeout, --stall-timeout, --retries, --request-timeout, --deadline
// (tools/net_flags.cpp): the network settings of http.h for one command.
struct NetworkFlags {
  std::string connect_timeout, stall_timeout, retries, request_timeout, deadline;
};
void add_network_flags(CLI::App& sub, NetworkFlags& flags);
// Sets the WEIGHTLIFT_* variables of the flags given, checks every network
// setting (kInvalidArgument naming the bad one), and returns the command's
// deadline scope (--deadline, else WEIGHTLIFT_DEADLINE; null when none).
Result<std::unique_ptr<ScopedNetworkDeadline>> apply_network_flags(const NetworkFlags& flags);

// Prints "weightlift: error: <file>: <what is wrong>" to stderr; returns 1.
int fail(const Status& s);
// Usage errors: prints the message (inert, text.h); returns 2.
int usage_error(const std::string& message);

// One JSON Lines record and its newline: ASCII only (control and non-ASCII
// characters as \u escapes, so the line is inert on a terminal and decodes to
// the exact value), a byte that is not UTF-8 as U+FFFD. Every --format jsonl
// line is written through it; text columns of tables go through inert().
std::string json_line(const nlohmann::ordered_json& j);

}  // namespace wl::cli

// Shared helpers for the tests: temporary directories, files, running the CLI.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace wl::testing {

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

// Sets (or unsets, with nullptr) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void write_bytes(const std::string& path, std::string_view bytes);
std::string read_bytes(const std::string& path);
// Names of the entries of a directory (sorted).
std::vector<std::string> list_dir(const std::string& path);

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs `argv` (argv[0] is the program) and captures stdout, stderr and the exit code.
CommandResult run_command(const std::vector<std::string>& argv, const std::string& stdin_data = {});
// Runs build/bin/weightlift with `args`.
CommandResult run_cli(const std::vector<std::string>& args);

// An 8-byte little-endian length prefix followed by `header`.
std::string st_prefix(std::string_view header);

}  // namespace wl::testing

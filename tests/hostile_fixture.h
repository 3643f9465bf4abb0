// The hostile server of tests/hostile/hostile_server.py (S3, Hub, ModelScope
// and plain-HTTP cases on loopback, plus "another host" and a silent port),
// started once per test process, and the helpers its tests share
// (net_hostile_test.cpp, integrity_test.cpp, shared_cache_test.cpp).
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "weightlift/http.h"
#include "weightlift/hub.h"
#include "weightlift/loader.h"

extern char** environ;

namespace wl {
namespace hostile {

using testing::run_command;
using testing::TempDir;

inline bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

// Loading while downloading, as the CLI does it: HubSource + load_files +
// finish(); the first error (the load's, else a blob's).
inline Result<LoadStats> load_from_hub(const std::string& repo, const std::string& revision, const HubOptions& hub,
                                       LoadOptions load, const std::function<Status(LoadedTensor&&)>& sink) {
  WL_ASSIGN_OR_RETURN(auto source, HubSource::start(repo, revision, hub));
  load.env = source->env();
  auto r = load_files(source->weight_files(), load, sink);
  Status rest = source->finish();
  if (r.ok() && !rest.ok()) return rest;
  return r;
}

using testing::ScopedEnv;

// The hostile server, started once per test process.
class HostileServer {
 public:
  HostileServer() {
    port_file_ = dir_.file("ports");
    std::string script = std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/hostile/hostile_server.py";
    std::vector<std::string> args = {"python3",  script,         "--port-file",
                                     port_file_, "--parent-pid", std::to_string(::getpid())};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    for (int i = 0; i < 600 && pid_ > 0; ++i) {  // bounded: 30 s on a loaded machine
      std::ifstream in(port_file_);
      if (in >> main_ >> other_ >> silent_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~HostileServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  bool ok() const { return main_ > 0; }
  std::string main(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(main_) + path; }
  std::string silent() const { return "http://127.0.0.1:" + std::to_string(silent_); }
  int other_port() const { return other_; }
  nlohmann::json get(const std::string& hook) const {
    HttpOptions o;
    o.dead_host_window_s = 0;
    HttpClient c(o);
    HttpRequest r;
    r.url = main(hook);
    auto resp = c.request(r);
    return resp.ok() ? nlohmann::json::parse(resp->body) : nlohmann::json();
  }

 private:
  TempDir dir_;
  std::string port_file_;
  pid_t pid_ = -1;
  int main_ = 0, other_ = 0, silent_ = 0;
};

inline HostileServer& server() {
  static HostileServer s;
  return s;
}

// Options with tiny timeouts, and no memory of dead hosts (every case shares the server's ports).
inline HttpOptions fast() {
  HttpOptions o;
  o.connect_timeout_s = 2;
  o.stall_timeout_s = 1;
  o.retry.max_attempts = 2;
  o.retry.base_delay_s = 0.01;
  o.dead_host_window_s = 0;
  return o;
}

// The s3:// source of Env::Default() pointed at a case of the hostile server.
class S3Case {
 public:
  explicit S3Case(const std::string& c)
      : ep_("AWS_ENDPOINT_URL", server().main("/s3/" + c).c_str()), anon_("AWS_NO_SIGN_REQUEST", "1"),
        id_("AWS_ACCESS_KEY_ID", nullptr), stall_("WEIGHTLIFT_STALL_TIMEOUT", "1"), retries_("WEIGHTLIFT_RETRIES", "1"),
        region_("AWS_REGION", "us-east-1"), s3ep_("AWS_ENDPOINT_URL_S3", nullptr),
        runai_("RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL", nullptr) {}

 private:
  ScopedEnv ep_, anon_, id_, stall_, retries_, region_, s3ep_, runai_;
};

inline HubOptions hub(const std::string& c, const std::string& cache) {
  HubOptions o;
  o.endpoint = server().main("/hub/" + c);
  o.cache_dir = cache;
  o.token = "";
  o.offline = false;
  o.http = fast();
  return o;
}

// Runs the CLI with extra environment variables (VAR=value) and arguments.
inline testing::CommandResult cli(const std::vector<std::string>& env, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"env"};
  for (const char* drop : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3",
                           "RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL", "HF_TOKEN"})
    argv.insert(argv.end(), {"-u", drop});
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(WEIGHTLIFT_CLI);
  argv.insert(argv.end(), args.begin(), args.end());
  return run_command(argv);
}

inline std::vector<std::string> s3_env(const std::string& c) {
  return {"AWS_ENDPOINT_URL=" + server().main("/s3/" + c), "AWS_NO_SIGN_REQUEST=1", "AWS_REGION=us-east-1",
          "WEIGHTLIFT_STALL_TIMEOUT=1", "WEIGHTLIFT_RETRIES=1"};
}

// The last line of stderr must say what failed: never "weightlift: error: " alone.
inline void expect_named_error(const testing::CommandResult& r, std::string_view url, std::string_view tensor = {}) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, std::string("weightlift: error: ") + std::string(url))) << r.err;
  if (!tensor.empty()) EXPECT_TRUE(contains(r.err, "tensor '" + std::string(tensor) + "'")) << r.err;
  EXPECT_FALSE(contains(r.err, "error: \n")) << r.err;
}

class Hostile : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server().ok()) << "the hostile server did not start"; }
  TempDir tmp_;
};

}  // namespace hostile
}  // namespace wl

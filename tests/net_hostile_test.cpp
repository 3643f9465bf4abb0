// Hostile servers (tests/hostile/hostile_server.py, on loopback) against the
// network policy: schemes, redirects, tokens, response bounds, admission
// before allocation, listings that must end, deadlines, messages that name
// the URL and the tensor, download hygiene. Each case takes seconds: the
// settings are made tiny (WEIGHTLIFT_* variables, HttpOptions fields).
// Runs in the release and the ASan+UBSan CTest passes.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "fault_injection_env.h"
#include "hostile_fixture.h"
#include "test_util.h"
#include "weightlift/http.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/s3.h"
#include "weightlift/weight_files.h"

extern char** environ;

namespace wl {
namespace {

using testing::read_bytes;
using testing::run_command;
using testing::TempDir;
using namespace hostile;  // NOLINT: the shared fixture of these tests

const Strategy kStrategies[] = {Strategy::kLazy, Strategy::kEager, Strategy::kThreads, Strategy::kStream,
                                Strategy::kPrefetch};

Status load_all(const std::vector<std::string>& files, Strategy s, Env* env = Env::Default(), size_t* n = nullptr) {
  LoadOptions o;
  o.strategy = s;
  o.env = env;
  o.block_size = 64 << 10;  // tensors above 64 KiB need more than one stream read
  o.threads = 4;
  size_t got = 0;
  auto r = load_files(files, o, [&](LoadedTensor&&) {
    ++got;
    return Status();
  });
  if (n) *n = got;
  return r.status();
}

// ---- 1. one network policy ---------------------------------------------------

TEST_F(Hostile, RedirectsToOtherSchemesAreRefused) {
  HttpClient c(fast());
  for (const char* which : {"redirect-file", "redirect-gopher"}) {
    HttpRequest r;
    r.url = server().main(std::string("/http/") + which + "/x.safetensors");
    auto resp = c.request(r);
    ASSERT_FALSE(resp.ok()) << which;
    EXPECT_EQ(resp.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(contains(resp.status().message(), "only http and https")) << resp.status().message();
  }
  // Neither the first URL.
  for (const char* url : {"file:///etc/passwd", "gopher://127.0.0.1:1/_x", "dict://127.0.0.1:1/d", "ftp://h/x"}) {
    HttpRequest r;
    r.url = url;
    auto resp = c.request(r);
    ASSERT_FALSE(resp.ok()) << url;
    EXPECT_EQ(resp.status().code(), Code::kInvalidArgument) << url;
  }
  // A Hub resolve that answers with another scheme: refused before any request there.
  for (const char* scheme : {"file", "ftp", "gopher", "dict"}) {
    auto p = hf_hub_download("org/m", "model.safetensors", "main",
                             hub(std::string("redirect-") + scheme, tmp_.file("cache")));
    ASSERT_FALSE(p.ok()) << scheme;
    EXPECT_TRUE(contains(p.status().message(), "not http or https")) << p.status().to_string();
    EXPECT_TRUE(contains(p.status().message(), "model.safetensors")) << p.status().to_string();
  }
  EXPECT_EQ(server().get("/_wl/silent")["accepts"], 0) << "a non-HTTP redirect reached a socket";
  // The CLI on a plain URL.
  auto r = cli({}, {"load", server().main("/http/redirect-file/x.safetensors"), "--no-progress"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "refusing to follow a redirect to a file:// URL")) << r.err;
}

TEST_F(Hostile, RedirectsAreBounded) {
  HttpClient c(fast());
  HttpRequest r;
  r.url = server().main("/http/redirect-loop/x");
  auto resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_TRUE(contains(resp.status().message(), "too many redirects (more than 10")) << resp.status().message();
  // Hub: resolve -> another host -> back -> another host ...
  auto p = hf_hub_download("org/m", "model.safetensors", "main", hub("redirect-loop", tmp_.file("cache")));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(contains(p.status().message(), "too many redirects")) << p.status().to_string();
}

TEST_F(Hostile, TheTokenNeverCrossesHosts) {
  (void)server().get("/_wl/log");  // clear
  HubOptions o = hub("token", tmp_.file("cache"));
  o.token = "hf_hostile_test_token";
  auto p = hf_hub_download("org/m", "model.safetensors", "main", o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  bool resolve_had_token = false, came_back = false;
  for (const auto& e : server().get("/_wl/log")) {
    const std::string path = e["path"], auth = e["auth"], port = e["port"];
    if (port == "main" && contains(path, "/resolve/main/model.safetensors")) resolve_had_token |= !auth.empty();
    if (port == "other") EXPECT_EQ(auth, "") << "the other host saw the token: " << path;
    if (port == "main" && contains(path, "/cdn/")) {  // redirected back to the first host: still no token
      came_back = true;
      EXPECT_EQ(auth, "") << path;
    }
  }
  EXPECT_TRUE(resolve_had_token);
  EXPECT_TRUE(came_back);
}

TEST_F(Hostile, ResponsesAreBounded) {
  // Headers.
  auto info = repo_info("org/m", "main", hub("huge-headers", tmp_.file("c1")));
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(contains(info.status().message(), "response headers larger than")) << info.status().to_string();
  // A JSON document announced larger than the bound, and one of unannounced length.
  for (const char* q : {"", "?chunked=1"}) {
    HttpClient c(fast());
    HttpRequest r;
    r.url = server().main(std::string("/hub/huge-json/api/models/org/m/revision/main") + q);
    auto resp = c.request(r);
    ASSERT_FALSE(resp.ok()) << q;
    EXPECT_EQ(resp.status().code(), Code::kOutOfRange) << resp.status().to_string();
    EXPECT_TRUE(contains(resp.status().message(), "response body larger than 16777216 bytes"))
        << resp.status().message();
  }
  // An error body of 64 MiB: the message, from the first bytes.
  auto missing = repo_info("org/m", "main", hub("huge-error", tmp_.file("c2")));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound) << missing.status().to_string();
  S3Case s3("huge-error");
  auto f = Env::Default()->open("s3://b/m/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kPermissionDenied) << f.status().to_string();
  EXPECT_TRUE(contains(f.status().message(), "AccessDenied")) << f.status().to_string();
}

// ---- 2. admission before allocation ---------------------------------------------

TEST_F(Hostile, AHugeRemoteTensorIsRefusedBeforeAllocationByEveryStrategy) {
  S3Case s3("huge-tensor");
  const std::string url = "s3://b/m/model.safetensors";
  for (Strategy s : kStrategies) {
    Status st = load_all({url}, s);
    ASSERT_FALSE(st.ok()) << strategy_name(s);
    EXPECT_EQ(st.code(), Code::kOutOfRange) << strategy_name(s) << ": " << st.to_string();
    EXPECT_TRUE(contains(st.message(), "cannot allocate 4398046511")) << st.to_string();
    EXPECT_TRUE(contains(st.message(), "nothing was allocated")) << st.to_string();
    EXPECT_EQ(st.file(), url) << strategy_name(s);
    EXPECT_EQ(st.tensor(), "huge") << strategy_name(s) << ": " << st.to_string();
  }
  // A plain http(s) URL, through the CLI (its memory cap does not let it through either).
  const std::string http = server().main("/http/huge-tensor/model.safetensors");
  auto r = cli({}, {"load", http, "--no-progress", "--max-memory", "64MiB"});
  expect_named_error(r, http, "huge");
  EXPECT_TRUE(contains(r.err, "cannot allocate")) << r.err;
}

std::vector<std::string> files_below(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec))
    if (it->is_regular_file()) out.push_back(it->path().string());
  return out;
}

TEST_F(Hostile, ALinkedSizeTheBlobDoesNotHaveLeavesNothingBehind) {
  for (bool parallel : {false, true}) {
    const std::string cache = tmp_.file(parallel ? "c-par" : "c-one");
    HubOptions o = hub("linked-size", cache);
    o.chunk_bytes = 1;  // the smallest chunks there are (clamped to 1 MiB)
    if (parallel) o.parallel_min_bytes = 1;
    auto p = hf_hub_download("org/m", "model.safetensors", "main", o);
    ASSERT_FALSE(p.ok());
    const std::string& m = p.status().message();
    EXPECT_TRUE(contains(m, "holds 262296 bytes") || contains(m, "free on the cache's disk")) << m;
    EXPECT_TRUE(contains(m, "model.safetensors")) << m;
    for (const auto& f : files_below(cache)) {
      EXPECT_FALSE(contains(f, ".incomplete")) << "left behind: " << f;
      struct stat st {};
      ASSERT_EQ(::stat(f.c_str(), &st), 0);
      EXPECT_LT(st.st_size, 1 << 20) << f;
    }
  }
  // Loading while downloading checks the same claim.
  HubOptions o = hub("linked-size", tmp_.file("c-load"));
  auto r = load_from_hub("org/m", "main", o, LoadOptions{}, [](LoadedTensor&&) { return Status(); });
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().to_string(), "model.safetensors")) << r.status().to_string();
}

TEST_F(Hostile, AnAbsurdLinkedSizeIsRefusedBeforeAnythingIsSized) {
  const std::string cache = tmp_.file("cache");
  auto p = hf_hub_download("org/m", "model.safetensors", "main", hub("linked-size-absurd", cache));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kOutOfRange) << p.status().to_string();
  EXPECT_TRUE(contains(p.status().message(), "free on the cache's disk")) << p.status().to_string();
  for (const auto& f : files_below(cache)) EXPECT_FALSE(contains(f, ".incomplete")) << f;
}

// ---- 3. listings terminate --------------------------------------------------------

TEST_F(Hostile, EndlessS3ListingsEnd) {
  {
    S3Case s3("endless-empty");
    auto l = Env::Default()->list_dir("s3://b/m/");
    ASSERT_FALSE(l.ok());
    EXPECT_TRUE(contains(l.status().message(), "empty pages in a row")) << l.status().to_string();
  }
  {
    S3Case s3("repeat-token");
    auto l = Env::Default()->list_dir("s3://b/m/");
    ASSERT_FALSE(l.ok());
    EXPECT_TRUE(contains(l.status().message(), "repeats a continuation token")) << l.status().to_string();
  }
  {
    S3Case s3("endless-keys");
    ScopedEnv cap("WEIGHTLIFT_LIST_MAX_PAGES", "20");
    auto l = Env::Default()->list_dir("s3://b/m/");
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), Code::kOutOfRange);
    EXPECT_TRUE(contains(l.status().message(), "did not end after 20 pages (WEIGHTLIFT_LIST_MAX_PAGES)"))
        << l.status().to_string();
  }
  {
    S3Case s3("endless-keys");
    ScopedEnv cap("WEIGHTLIFT_LIST_MAX_ENTRIES", "15");
    auto l = Env::Default()->list_dir("s3://b/m/");
    ASSERT_FALSE(l.ok());
    EXPECT_TRUE(contains(l.status().message(), "more than 15 entries")) << l.status().to_string();
  }
  // The CLI says so too (a load of the prefix).
  auto r = cli({"AWS_ENDPOINT_URL=" + server().main("/s3/endless-empty"), "AWS_NO_SIGN_REQUEST=1"},
               {"load", "s3://b/m/", "--no-progress"});
  expect_named_error(r, "s3://b/m/");
  EXPECT_TRUE(contains(r.err, "empty pages in a row")) << r.err;
}

TEST_F(Hostile, EndlessHubTreeListingsEnd) {
  auto t = list_repo_tree("org/m", "main", "", true, hub("tree-endless", tmp_.file("c1")));
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.status().message(), "empty pages in a row")) << t.status().to_string();
  HubOptions o = hub("tree-endless-entries", tmp_.file("c2"));
  o.http.max_list_pages = 25;
  t = list_repo_tree("org/m", "main", "", true, o);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.status().message(), "did not end after 25 pages")) << t.status().to_string();
  o.http.max_list_pages = 1000;
  o.http.max_list_entries = 30;
  t = list_repo_tree("org/m", "main", "", true, o);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.status().message(), "more than 30 entries")) << t.status().to_string();
}

// ---- 4. deadlines -------------------------------------------------------------------

TEST_F(Hostile, ASilentServerFailsWithTheUrlTheAttemptsAndTheTime) {
  HttpOptions o = fast();
  HttpClient c(o);
  HttpRequest r;
  r.url = server().silent() + "/api/models/org/m/revision/main?x=secret";
  auto resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  const std::string& m = resp.status().message();
  EXPECT_EQ(resp.status().code(), Code::kUnavailable);
  EXPECT_TRUE(contains(m, "GET " + server().silent() + "/api/models/org/m/revision/main:")) << m;
  EXPECT_FALSE(contains(m, "secret")) << m;
  EXPECT_TRUE(contains(m, "(2 attempts in ")) << m;
  EXPECT_TRUE(contains(m, "--stall-timeout 1 s")) << m;
  // With the memory of dead hosts on, the next request to it fails at once, saying why.
  o.dead_host_window_s = 30;
  HttpClient remembering(o);
  (void)remembering.request(r);
  auto again = remembering.request(r);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(contains(again.status().message(), "not tried: http://127.0.0.1:")) << again.status().message();
}

TEST_F(Hostile, TheCliHonoursItsTimeoutFlagsAndDeadline) {
  const std::string repo_url = server().silent();
  // --stall-timeout / --retries, on a Hub endpoint that never answers.
  auto r = cli({"HF_ENDPOINT=" + repo_url, "HF_HUB_CACHE=" + tmp_.file("c")},
               {"download", "org/m", "-q", "--stall-timeout", "1", "--retries", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, repo_url)) << r.err;
  EXPECT_TRUE(contains(r.err, "(1 attempt in ")) << r.err;
  // --deadline ends everything, whatever the other settings.
  r = cli({"HF_ENDPOINT=" + repo_url, "HF_HUB_CACHE=" + tmp_.file("c")},
          {"download", "org/m", "-q", "--stall-timeout", "30", "--deadline", "1.5"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "the deadline (--deadline 1.5 s) passed")) << r.err;
  // Environment variables, and a bad value is a usage error naming it.
  r = cli({"HF_ENDPOINT=" + repo_url, "HF_HUB_CACHE=" + tmp_.file("c"), "WEIGHTLIFT_DEADLINE=1"},
          {"download", "org/m", "-q"});
  EXPECT_TRUE(contains(r.err, "the deadline (WEIGHTLIFT_DEADLINE 1 s) passed")) << r.err;
  r = cli({"WEIGHTLIFT_STALL_TIMEOUT=soon"}, {"download", "org/m", "-q"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "WEIGHTLIFT_STALL_TIMEOUT='soon' is not a positive number of seconds")) << r.err;
  r = cli({}, {"ls", "org/m", "--retries", "many"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "WEIGHTLIFT_RETRIES='many'")) << r.err;
}

TEST_F(Hostile, ATricklingServerIsGivenUpOn) {
  // Hub blob: a byte every 0.3 s.
  auto p = hf_hub_download("org/m", "model.safetensors", "main", hub("trickle", tmp_.file("cache")));
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(contains(p.status().message(), "stalled at byte")) << p.status().to_string();
  EXPECT_TRUE(contains(p.status().message(), "2 attempts in a row delivered under 64 KiB")) << p.status().to_string();
  // A plain URL read: resumes bounded the same way.
  ScopedEnv stall("WEIGHTLIFT_STALL_TIMEOUT", "1"), retries("WEIGHTLIFT_RETRIES", "1");
  const std::string url = server().main("/http/trickle/model.safetensors");
  auto f = Env::Default()->open(url);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  std::string buf(100, '\0');
  Status s = (*f)->read_at(0, std::as_writable_bytes(std::span(buf.data(), buf.size())));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.file(), url);
  EXPECT_TRUE(contains(s.message(), "giving up on bytes 0-")) << s.to_string();
  // A deadline per request ends even a transfer that keeps moving.
  ScopedEnv slow_ok("WEIGHTLIFT_STALL_TIMEOUT", "30"), deadline("WEIGHTLIFT_REQUEST_TIMEOUT", "1");
  auto g = Env::Default()->open(url);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  s = (*g)->read_at(0, std::as_writable_bytes(std::span(buf.data(), buf.size())));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.message(), "the deadline (--request-timeout 1 s) passed")) << s.to_string();
}

// ---- 5. every error has its message ------------------------------------------------------

TEST_F(Hostile, AFramingFaultNamesTheUrlAndTheTensorInEveryStrategy) {
  S3Case s3("framing");
  const std::string url = "s3://b/m/model.safetensors";
  for (Strategy s : kStrategies) {
    size_t n = 0;
    Status st = load_all({url}, s, Env::Default(), &n);
    ASSERT_FALSE(st.ok()) << strategy_name(s);
    EXPECT_EQ(st.code(), Code::kCorruptData) << st.to_string();
    EXPECT_EQ(st.file(), url) << strategy_name(s) << ": " << st.to_string();
    EXPECT_TRUE(contains(st.message(), "the server answered Content-Range 'bytes 0-0/")) << st.to_string();
    // Eager and threads read the whole file in one request: no single tensor to name.
    if (s != Strategy::kEager && s != Strategy::kThreads) EXPECT_EQ(st.tensor(), "big") << strategy_name(s);
  }
  // The stream strategy's message through the CLI (a tensor read in several requests).
  auto r = cli(s3_env("framing"), {"load", url, "--strategy", "stream", "--block-size", "64KiB", "--no-progress"});
  expect_named_error(r, url, "big");
}

TEST_F(Hostile, ALocalReadFailureNamesTheFileAndTheTensorInEveryStrategy) {
  const std::string path = tmp_.file("model.safetensors");
  ASSERT_TRUE(testing::write_test_model(path, 8, 256 << 10).ok());
  auto probe = SafetensorsFile::open(path);
  ASSERT_TRUE(probe.ok());
  const TensorInfo& fifth = (*probe)->tensors()[4];
  for (Strategy s : kStrategies) {
    testing::FaultInjectionEnv env;
    env.add({.path_suffix = "model.safetensors", .eio_from_offset = fifth.offset + (200 << 10)});
    Status st = load_all({path}, s, &env);
    ASSERT_FALSE(st.ok()) << strategy_name(s);
    EXPECT_EQ(st.code(), Code::kIoError) << st.to_string();
    EXPECT_EQ(st.file(), path) << strategy_name(s);
    EXPECT_TRUE(contains(st.message(), "Input/output error")) << strategy_name(s) << ": " << st.to_string();
    if (s != Strategy::kEager && s != Strategy::kThreads) EXPECT_EQ(st.tensor(), fifth.name) << strategy_name(s);
  }
}

// ---- 6. download hygiene ---------------------------------------------------------------------

TEST_F(Hostile, NestedKeysGoToSubfoldersAndTheRestIsNamed) {
  const std::string out = tmp_.file("dl");
  auto r = cli(s3_env("nested"), {"download", "s3://b/m/", out, "--configs"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_bytes(out + "/config.json"), "{\"architectures\": [\"Hostile\"]}\n");
  EXPECT_EQ(read_bytes(out + "/sub/tokenizer.json"), "{}");
  EXPECT_EQ(read_bytes(out + "/sub/deeper/special.txt"), "t");
  EXPECT_EQ(read_bytes(out + "/notes/changelog.txt"), "notes");  // *.txt is a config pattern
  EXPECT_TRUE(contains(r.err, "left out 1 other file under s3://b/m/ (not weights or configs): training_args.bin"))
      << r.err;
  // Without --configs, the configs are named as left out.
  r = cli(s3_env("nested"), {"download", "s3://b/m/", tmp_.file("dl2")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "left out 5 other files")) << r.err;
  EXPECT_TRUE(contains(r.err, "sub/tokenizer.json")) << r.err;
}

TEST_F(Hostile, UnsafeKeysAreRefusedNamingThem) {
  // (A key with a '/' after the prefix comes back as a common prefix: "m/../", "m//".)
  for (auto [c, key] : {std::pair{"backslash", "m/evil\\x.json"}, {"dotdot", "m/../"}, {"doubleslash", "m//"}}) {
    auto r = cli(s3_env(c), {"download", "s3://b/m/", tmp_.file(std::string("dl-") + c), "--configs", "-q"});
    EXPECT_EQ(r.exit_code, 1) << c << ": " << r.err;
    EXPECT_TRUE(contains(r.err, std::string("refusing listed key '") + key + "'")) << c << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(tmp_.file(std::string("dl-") + c) + "/evil\\x.json"));
    r = cli(s3_env(c), {"ls", "s3://b/m/"});
    EXPECT_EQ(r.exit_code, 1) << c;
    EXPECT_TRUE(contains(r.err, std::string("refusing listed key '") + key + "'")) << c << ": " << r.err;
  }
}

TEST_F(Hostile, ARegularFileServedByAnotherHostDownloadsWhole) {
  auto p = hf_hub_download("org/m", "config.json", "main", hub("nonlfs-crosshost", tmp_.file("cache")));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(read_bytes(*p), "{\"architectures\": [\"Hostile\"]}\n");
}

// ---- without a server -------------------------------------------------------------------------

TEST(NetSettings, EnvironmentVariablesAndTheirErrors) {
  {
    ScopedEnv a("WEIGHTLIFT_CONNECT_TIMEOUT", "2.5"), b("WEIGHTLIFT_STALL_TIMEOUT", "3"), c("WEIGHTLIFT_RETRIES", "0"),
        d("WEIGHTLIFT_REQUEST_TIMEOUT", "60"), e("WEIGHTLIFT_MAX_REDIRECTS", "3"), f("WEIGHTLIFT_LIST_MAX_PAGES", "7"),
        g("WEIGHTLIFT_LIST_MAX_ENTRIES", "9");
    HttpOptions o;
    EXPECT_TRUE(o.invalid.empty()) << o.invalid;
    EXPECT_EQ(o.connect_timeout_s, 2.5);
    EXPECT_EQ(o.stall_timeout_s, 3);
    EXPECT_EQ(o.retry.max_attempts, 1);
    EXPECT_EQ(o.request_timeout_s, 60);
    EXPECT_EQ(o.max_redirects, 3);
    EXPECT_EQ(o.max_list_pages, 7u);
    EXPECT_EQ(o.max_list_entries, 9u);
  }
  HttpOptions d;  // the defaults: a dead server fails within about a minute
  EXPECT_EQ(d.connect_timeout_s, 10);
  EXPECT_EQ(d.stall_timeout_s, 10);
  EXPECT_EQ(d.retry.max_attempts, 5);
  EXPECT_EQ(d.request_timeout_s, 0);
  for (auto [name, value] : {std::pair{"WEIGHTLIFT_STALL_TIMEOUT", "0"},
                             {"WEIGHTLIFT_CONNECT_TIMEOUT", "-1"},
                             {"WEIGHTLIFT_RETRIES", "1e3"},
                             {"WEIGHTLIFT_LIST_MAX_PAGES", "0"},
                             {"WEIGHTLIFT_REQUEST_TIMEOUT", "nan"}}) {
    ScopedEnv v(name, value);
    HttpOptions o;
    EXPECT_TRUE(contains(o.invalid, std::string(name) + "='" + value + "'")) << name << ": " << o.invalid;
    HttpClient c(o);
    HttpRequest r;
    r.url = "http://127.0.0.1:9/";
    auto resp = c.request(r);
    ASSERT_FALSE(resp.ok());
    EXPECT_EQ(resp.status().code(), Code::kInvalidArgument);
  }
}

TEST(NetSettings, AProcessDeadlineEndsRequestsAtOnceOncePassed) {
  ScopedNetworkDeadline d(0.001, "--deadline");
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  HttpClient c;
  HttpRequest r;
  r.url = "http://127.0.0.1:9/x";
  auto resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_TRUE(contains(resp.status().message(), "the deadline (--deadline 0.001 s) passed after 0 attempts"))
      << resp.status().message();
}

}  // namespace
}  // namespace wl

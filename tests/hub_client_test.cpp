// The Hub client against the loopback Hub-protocol server (tests/hubserver),
// plus the pure helpers (patterns, names, path checks, error mapping).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fault_injection_env.h"
#include "test_util.h"
#include "weightlift/glob.h"
#include "weightlift/hash.h"
#include "weightlift/http.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/text.h"

extern char** environ;

namespace wl {
namespace {

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

using testing::read_bytes;
using testing::ScopedEnv;
using testing::TempDir;
using testing::write_bytes;

constexpr const char* kToken = "hf_cxx_test_token_0123456789";

// Starts tests/hubserver/hubserver.py on loopback ports chosen by the OS.
class HubServerProcess {
 public:
  explicit HubServerProcess(const std::string& root) {
    port_file_ = root + ".ports";
    std::string script = std::string(WEIGHTLIFT_SOURCE_DIR) + "/tests/hubserver/hubserver.py";
    std::string parent = std::to_string(::getpid());
    std::vector<std::string> args = {"python3",      script, "--root",      root, "--port-file", port_file_,
                                     "--parent-pid", parent, "--page-size", "2",  "--token",     kToken};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    for (int i = 0; i < 400 && pid_ > 0; ++i) {  // bounded: 20 s
      std::ifstream in(port_file_);
      if (in >> hub_port_ >> cdn_port_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~HubServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st;
      ::waitpid(pid_, &st, 0);
    }
    ::unlink(port_file_.c_str());
  }
  bool ok() const { return hub_port_ > 0; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(hub_port_); }
  bool hook(const std::string& path_and_query) const {  // test hooks of the server
    HttpClient c;
    HttpRequest r;
    r.url = endpoint() + path_and_query;
    auto resp = c.request(r);
    return resp.ok() && resp->status == 200;
  }
  nlohmann::json stats() const {
    HttpClient c;
    HttpRequest r;
    r.url = endpoint() + "/_wl/stats";
    auto resp = c.request(r);
    return resp.ok() ? nlohmann::json::parse(resp->body) : nlohmann::json();
  }

 private:
  pid_t pid_ = -1;
  std::string port_file_;
  int hub_port_ = 0, cdn_port_ = 0;
};

void put(const std::string& root, const std::string& rel, const std::string& bytes) {
  std::string p = root + "/" + rel;
  for (size_t i = p.find('/', 1); i != std::string::npos; i = p.find('/', i + 1)) ::mkdir(p.substr(0, i).c_str(), 0755);
  write_bytes(p, bytes);
}

std::string st_file(const std::string& name) {  // a tiny valid safetensors file
  std::string h = R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  return testing::st_prefix(h) + name.substr(0, 4) + std::string(4 - std::min<size_t>(4, name.size()), 'x');
}

class HubServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.file("repos");
    // Sharded safetensors with an index, plus a consolidated file and original/.
    put(root_, "org/sharded/main/config.json", "{}");
    put(root_, "org/sharded/main/model-00001-of-00002.safetensors", st_file("a"));
    put(root_, "org/sharded/main/model-00002-of-00002.safetensors", st_file("b"));
    put(root_, "org/sharded/main/consolidated.safetensors", st_file("c"));
    put(root_, "org/sharded/main/original/extra.safetensors", st_file("d"));
    put(root_, "org/sharded/main/model.safetensors.index.json",
        R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"}})");
    put(root_, "org/binonly/main/pytorch_model.bin", "binbytes");
    put(root_, "org/binonly/main/config.json", "{}");
    put(root_, "org/gated/main/w.safetensors", st_file("g"));
    put(root_, "org/gated/.gated", "");
    slow_ = std::string(3 << 19, 's');  // 1.5 MiB: the server sends 1 MiB slices
    put(root_, "org/slow/main/slow.txt", slow_);
    server_ = std::make_unique<HubServerProcess>(root_);
    ASSERT_TRUE(server_->ok()) << "the test Hub server did not start";
    o_.endpoint = server_->endpoint();
    o_.cache_dir = tmp_.file("cache");
    o_.token = "";  // anonymous unless a test sets one
    o_.offline = false;
    o_.http.retry.base_delay_s = 0.01;
  }
  TempDir tmp_;
  std::string root_;
  std::unique_ptr<HubServerProcess> server_;
  HubOptions o_;
  std::string slow_;
};

TEST_F(HubServerTest, StalledLinkIsAbortedAndResumed) {
  // 1 KB/s per connection after a 1 MiB burst: the server then stalls for
  // seconds; the stall timeout (1 s here) aborts and a Range request fetches the rest.
  ASSERT_TRUE(server_->hook("/_wl/rate?bytes_per_s=1000&burst=1048576"));
  o_.http.stall_timeout_s = 1;
  std::vector<std::string> logged;
  o_.log = [&](const std::string& s) { logged.push_back(s); };
  auto p = hf_hub_download("org/slow", "slow.txt", "main", o_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(read_bytes(*p), slow_);
  ASSERT_FALSE(logged.empty());
  EXPECT_NE(logged[0].find("resuming"), std::string::npos) << logged[0];
}

TEST_F(HubServerTest, HfHubDownloadWritesTheHuggingfaceLayout) {
  auto p = hf_hub_download("org/sharded", "config.json", "main", o_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(read_bytes(*p), "{}");
  std::string storage = o_.cache_dir + "/models--org--sharded";
  std::string commit = read_bytes(storage + "/refs/main");
  EXPECT_EQ(*p, storage + "/snapshots/" + commit + "/config.json");
  char buf[256];
  ssize_t n = ::readlink(p->c_str(), buf, sizeof buf);
  ASSERT_GT(n, 0);
  std::string target(buf, static_cast<size_t>(n));
  EXPECT_TRUE(target.starts_with("../../blobs/")) << target;
  // git blob sha1 of "{}"
  EXPECT_EQ(target, "../../blobs/9e26dfeeb6e641a33dae4961196235bdb965b21b");
  // Offline, the ref serves it again.
  HubOptions off = o_;
  off.offline = true;
  auto again = hf_hub_download("org/sharded", "config.json", "main", off);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *p);
}

TEST_F(HubServerTest, MissingEntryIsCachedInNoExist) {
  auto p = hf_hub_download("org/sharded", "nope.json", "main", o_);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::kNotFound);
  EXPECT_NE(p.status().message().find("entry not found"), std::string::npos) << p.status().message();
  std::string storage = o_.cache_dir + "/models--org--sharded";
  std::string commit = read_bytes(storage + "/refs/main");
  EXPECT_TRUE(Env::Default()->exists(storage + "/.no_exist/" + commit + "/nope.json"));
  HubOptions off = o_;
  off.offline = true;
  auto q = hf_hub_download("org/sharded", "nope.json", "main", off);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("cached as missing"), std::string::npos) << q.status().message();
}

TEST_F(HubServerTest, TreeListingFollowsPagination) {
  auto t = list_repo_tree("org/sharded", "main", "", /*recursive=*/true, o_);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::vector<std::string> files;
  for (const auto& e : *t)
    if (!e.is_dir) files.push_back(e.path);
  EXPECT_EQ(files.size(), 6u);  // page size 2: three or more pages
  bool lfs = false;
  for (const auto& e : *t)
    if (e.path == "consolidated.safetensors") lfs = e.lfs_sha256 == sha256_hex(st_file("c"));
  EXPECT_TRUE(lfs);
}

TEST_F(HubServerTest, DownloadWeightsUsesTheIndex) {
  auto folder = download_weights_from_hf("org/sharded", {"*.safetensors", "*.bin"}, "main", {}, o_);
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  auto names = testing::list_dir(*folder);
  EXPECT_EQ(names, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"}));
}

TEST_F(HubServerTest, DownloadWeightsTakesTheFirstMatchingPattern) {
  auto folder = download_weights_from_hf("org/binonly", {"*.safetensors", "*.bin", "*.pt"}, "main", {}, o_);
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  EXPECT_EQ(testing::list_dir(*folder), (std::vector<std::string>{"pytorch_model.bin"}));
  EXPECT_TRUE(Env::Default()->exists(model_lock_path("org/binonly", o_.cache_dir)));
}

TEST_F(HubServerTest, MissingIndexIsFine) {
  std::vector<std::string> logged;
  o_.log = [&](const std::string& s) { logged.push_back(s); };
  Status s = download_safetensors_index_file_from_hf("org/binonly", "model.safetensors.index.json", "main", o_);
  EXPECT_TRUE(s.ok()) << s.to_string();
  ASSERT_FALSE(logged.empty());
  EXPECT_NE(logged[0].find("no model.safetensors.index.json"), std::string::npos);
}

TEST_F(HubServerTest, ResolveModelPathDownloadsThenServesOffline) {
  auto p = resolve_model_path("org/sharded", "main", o_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE(Env::Default()->exists(*p + "/config.json"));
  EXPECT_FALSE(Env::Default()->exists(*p + "/consolidated.safetensors"));
  HubOptions off = o_;
  off.offline = true;
  auto q = resolve_model_path("org/sharded", "main", off);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(*q, *p);
  auto local = resolve_model_path(tmp_.path(), "main", off);
  ASSERT_TRUE(local.ok());
  EXPECT_EQ(*local, tmp_.path());
  auto bad = resolve_model_path("/no/such/dir", "main", off);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kNotFound);
}

TEST_F(HubServerTest, GatedNeedsTheTokenAndTheCdnNeverSeesIt) {
  auto denied = snapshot_download("org/gated", {}, o_);
  ASSERT_FALSE(denied.ok());
  EXPECT_NE(denied.status().message().find("gated"), std::string::npos) << denied.status().message();
  o_.token = kToken;
  auto ok = snapshot_download("org/gated", {}, o_);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  auto stats = server_->stats();
  EXPECT_TRUE(stats["cdn_auth"].empty()) << stats["cdn_auth"].dump();
  EXPECT_EQ(stats["bytes"]["w.safetensors"], st_file("g").size());
}

TEST_F(HubServerTest, RetriesHonourRetryAfterAndGiveUpClearly) {
  // 2 x 429 then success
  ASSERT_TRUE(server_->hook("/_wl/faults?mode=429&count=2&retry_after=0"));
  auto p = hf_hub_download("org/binonly", "pytorch_model.bin", "main", o_);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(read_bytes(*p), "binbytes");
  ASSERT_TRUE(server_->hook("/_wl/faults?mode=500&count=100"));
  auto q = hf_hub_download("org/binonly", "config.json", "main", o_);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::kUnavailable);
  EXPECT_NE(q.status().message().find("HTTP 500"), std::string::npos) << q.status().message();
  EXPECT_NE(q.status().message().find("5 attempts"), std::string::npos) << q.status().message();
}

TEST_F(HubServerTest, ModelScopeProtocol) {
  ::setenv("VLLM_USE_MODELSCOPE", "1", 1);
  auto folder = download_weights_from_hf("org/binonly", {"*.safetensors", "*.bin"}, "master", {}, o_);
  ::unsetenv("VLLM_USE_MODELSCOPE");
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  // modelscope's own layout (modelscope-hub), which its client finds with local_files_only=True.
  EXPECT_EQ(*folder, o_.cache_dir + "/models/org--binonly/snapshots/master");
  EXPECT_EQ(read_bytes(*folder + "/pytorch_model.bin"), "binbytes");
}

TEST_F(HubServerTest, SnapshotFollowsEveryTreePageAndKeepsTheListing) {
  // Page size 2: a skipped page loses files from the snapshot and from trees/{commit}.json.
  auto folder = snapshot_download("org/sharded", {}, o_);
  ASSERT_TRUE(folder.ok()) << folder.status().to_string();
  std::vector<std::string> want = {"config.json",
                                   "consolidated.safetensors",
                                   "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors",
                                   "model.safetensors.index.json",
                                   "original/extra.safetensors"};
  for (const auto& f : want) EXPECT_TRUE(Env::Default()->exists(*folder + "/" + f)) << f;
  const std::string storage = o_.cache_dir + "/models--org--sharded";
  auto tree = nlohmann::json::parse(read_bytes(storage + "/trees/" + base_name(*folder) + ".json"));
  EXPECT_EQ(tree["format_version"], 1);
  EXPECT_EQ(tree["files"].size(), want.size());
  EXPECT_EQ(tree["files"]["consolidated.safetensors"]["lfs_sha256"], sha256_hex(st_file("c")));
  EXPECT_TRUE(Env::Default()->exists(o_.cache_dir + "/CACHEDIR.TAG"));
}

TEST_F(HubServerTest, RevisionNotFoundNamesRepositoryAndRevision) {
  SnapshotOptions s;
  s.revision = "no-such-branch";
  auto r = snapshot_download("org/sharded", s, o_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  const std::string m = r.status().message();
  EXPECT_TRUE(m.starts_with("revision not found: 'no-such-branch' is not a branch, tag or commit of org/sharded")) << m;
}

TEST_F(HubServerTest, PatternsMatchingNothingWarn) {
  std::vector<std::string> logged;
  o_.log = [&](const std::string& line) { logged.push_back(line); };
  SnapshotOptions s;
  s.allow_patterns = {"*.gguf"};
  auto r = snapshot_download("org/sharded", s, o_);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("No files matched allow_patterns=['*.gguf']"), std::string::npos) << logged[0];
}

TEST_F(HubServerTest, WriteFaultsLeaveNoFileUnderAFinalName) {
  testing::FaultInjectionEnv env;
  o_.env = &env;
  const std::string blob = o_.cache_dir + "/models--org--slow/blobs/" + sha256_hex(slow_);  // an LFS file (> 1 MiB)
  // The disk fills up mid-blob: a clear error naming the partial file, and no blob.
  env.add_write({.path_part = ".incomplete", .enospc_after_bytes = 100000});
  auto full = hf_hub_download("org/slow", "slow.txt", "main", o_);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), Code::kIoError);
  EXPECT_NE(full.status().to_string().find("No space left on device"), std::string::npos) << full.status().to_string();
  EXPECT_NE(full.status().message().find("slow.txt of org/slow (revision main)"), std::string::npos)
      << full.status().message();
  EXPECT_FALSE(Env::Default()->exists(blob));
  // The final rename fails: still nothing under the final name.
  env.clear();
  env.add_write({.path_part = "/blobs/" + base_name(blob), .rename_errno = EXDEV});
  auto moved = hf_hub_download("org/slow", "slow.txt", "main", o_);
  ASSERT_FALSE(moved.ok());
  EXPECT_NE(moved.status().to_string().find("cannot rename"), std::string::npos) << moved.status().to_string();
  EXPECT_FALSE(Env::Default()->exists(blob));
  // Healed: the download completes, resuming the partial file it left.
  env.clear();
  auto ok = hf_hub_download("org/slow", "slow.txt", "main", o_);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(read_bytes(*ok), slow_);
  EXPECT_GT(env.counters().renames.load(), 0u);
}

TEST_F(HubServerTest, LoadWhileDownloadingFillsTheCacheAndTheTensors) {
  // One pass from an empty cache: the source serves the files while they download.
  std::vector<std::string> names;
  auto source = HubSource::start("org/sharded", "main", o_);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  LoadOptions lo{.strategy = Strategy::kStream};
  lo.env = (*source)->env();
  auto r = load_files((*source)->weight_files(), lo, [&](LoadedTensor&& t) {
    names.push_back(t.name);
    return Status();
  });
  Status finished = (*source)->finish();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_TRUE(finished.ok()) << finished.to_string();
  EXPECT_EQ(r->tensors, 2u);  // the index's two shards, not consolidated.safetensors
  const std::string storage = o_.cache_dir + "/models--org--sharded";
  const std::string snap = storage + "/snapshots/" + read_bytes(storage + "/refs/main");
  EXPECT_EQ(read_bytes(snap + "/model-00001-of-00002.safetensors"), st_file("a"));
  EXPECT_EQ(read_bytes(snap + "/model-00002-of-00002.safetensors"), st_file("b"));
  for (const auto& n : testing::list_dir(storage + "/blobs")) EXPECT_EQ(n.find('.'), std::string::npos) << n;
  // A second load finds everything cached: nothing is pending.
  auto again = HubSource::start("org/sharded", "main", o_);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_TRUE((*again)->pending().empty());
  EXPECT_EQ((*again)->weight_files().size(), 2u);
}

TEST_F(HubServerTest, BadRepoIdsAndRevisionsAreRefused) {
  auto a = snapshot_download("../etc", {}, o_);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("invalid repository id"), std::string::npos);
  SnapshotOptions s;
  s.revision = "../../x";
  auto b = snapshot_download("org/sharded", s, o_);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("invalid revision"), std::string::npos);
}

// ---- pure helpers ------------------------------------------------------------------

TEST(HubNames, RepoFolderName) {
  EXPECT_EQ(repo_folder_name("org/name"), "models--org--name");
  EXPECT_EQ(repo_folder_name("gpt2"), "models--gpt2");
  EXPECT_EQ(repo_folder_name("org/ds", "dataset"), "datasets--org--ds");
}

TEST(HubPatterns, FnmatchLikePython) {
  EXPECT_TRUE(glob_match("*.safetensors", "model.safetensors"));
  EXPECT_TRUE(glob_match("*.safetensors", "original/x.safetensors"));  // '*' crosses '/'
  EXPECT_TRUE(glob_match("a?.bin", "a1.bin"));
  EXPECT_TRUE(glob_match("a[0-9].bin", "a1.bin"));
  EXPECT_FALSE(glob_match("a[!b].bin", "ab.bin"));
  EXPECT_TRUE(glob_match("a[]].bin", "a].bin"));
  EXPECT_TRUE(glob_match("a[.bin", "a[.bin"));  // unclosed bracket is literal
  EXPECT_FALSE(glob_match("*.safetensors", "model.bin"));
  EXPECT_EQ(filter_repo_files({"a.json", "sub/b.txt", "sub/c.json", "d.bin"}, {"*.json", "sub/"}, {"sub/c*"}),
            (std::vector<std::string>{"a.json", "sub/b.txt"}));
  EXPECT_EQ(filter_repo_files({"a", "b"}, {}, {}).size(), 2u);
}

TEST(HubPaths, TraversalRefused) {
  for (const char* bad : {"../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b", ""}) {
    Status s = check_repo_path(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("refusing repository file name"), std::string::npos) << s.message();
  }
  EXPECT_TRUE(check_repo_path("a/b.c/d..e").ok());
}

TEST(HubPaths, ControlCharactersRefused) {
  for (std::string ok : {"config.json", "sub/dir/model-00001-of-00002.safetensors", "模型.bin"})
    EXPECT_TRUE(check_repo_path(ok).ok()) << ok;
  for (const std::string& bad : std::vector<std::string>{"a\nb.json", "a\rb", "a\tb", "a\x1b[2Jb", "a\x7f", "a\xc2\x9b",
                                                         "a\xe2\x80\xae", "a\xff", std::string("a\0b", 3)}) {
    Status s = check_repo_path(bad);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << inert(bad);
    EXPECT_TRUE(contains(s.message(), "control character")) << s.message();
    EXPECT_FALSE(has_control_chars(s.to_string()));
  }
}

// A token holding a control character, from any of its sources, is refused
// naming the source, never the value; no Hub call is then made.
TEST(HubToken, EverySourceHoldingAControlCharacterIsRefusedByName) {
  TempDir dir;
  ScopedEnv home("HF_HOME", dir.path().c_str());
  ScopedEnv path("HF_TOKEN_PATH", nullptr);
  {
    ScopedEnv t("HF_TOKEN", "hf_good\n");  // a trailing newline is trimmed, as huggingface_hub trims it
    auto r = hub_token({});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(**r, "hf_good");
  }
  struct Case {
    const char* hf_token;
    const char* legacy;
    const char* file;  // the token file's text (nullptr: none)
    bool via_path;     // the file named by HF_TOKEN_PATH
    std::string named;
  };
  const std::string file = dir.file("token"), other = dir.file("other-token");
  for (const Case& c : {Case{"hf_a\r\nX-Injected: 1", nullptr, nullptr, false, "HF_TOKEN"},
                        Case{nullptr, "hf_a\nX-Injected: 1", nullptr, false, "HUGGING_FACE_HUB_TOKEN"},
                        Case{nullptr, nullptr, "hf_a\nX-Injected: 1\n", false, "the token file " + file},
                        Case{nullptr, nullptr, "hf_a\r\nX-Injected: 1", true, other + " (HF_TOKEN_PATH)"}}) {
    SCOPED_TRACE(c.named);
    ScopedEnv t("HF_TOKEN", c.hf_token);
    ScopedEnv l("HUGGING_FACE_HUB_TOKEN", c.legacy);
    ScopedEnv p("HF_TOKEN_PATH", c.via_path ? other.c_str() : nullptr);
    std::remove(file.c_str());
    std::remove(other.c_str());
    if (c.file) testing::write_bytes(c.via_path ? other : file, c.file);
    auto r = hub_token({});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(contains(r.status().message(), c.named)) << r.status().message();
    EXPECT_FALSE(contains(r.status().to_string(), "hf_a")) << r.status().to_string();
    EXPECT_FALSE(contains(r.status().to_string(), "Injected")) << r.status().to_string();
  }
  HubOptions o;
  o.token = "hf_a\r\nX-Injected: 1";
  auto r = hub_token(o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "--token")) << r.status().message();
  // And nothing is asked of the server: every Hub call stops at the token.
  o.endpoint = "http://127.0.0.1:1";
  auto info = repo_info("org/m", "main", o);
  ASSERT_FALSE(info.ok());
  EXPECT_TRUE(contains(info.status().message(), "--token")) << info.status().to_string();
}

TEST(HubLock, NameAndMode) {
  TempDir d;
  std::string p = model_lock_path("org/name", d.path());
  EXPECT_EQ(p, d.path() + "/" + sha256_hex("org-name") + "org-name.lock");
  auto lock = ModelLock::acquire("org/name", d.path());
  ASSERT_TRUE(lock.ok()) << lock.status().to_string();
  struct stat st;
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  int fd = ::open(p.c_str(), O_RDWR);
  EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0);  // held
  ::close(fd);
}

TEST(Http, OriginAndErrors) {
  EXPECT_EQ(url_origin("http://127.0.0.1:8080/a?b"), "http://127.0.0.1:8080");
  EXPECT_EQ(url_origin("HTTPS://Example.com/x"), "https://example.com:443");
  EXPECT_NE(url_origin("http://a:1/x"), url_origin("http://a:2/x"));
  EXPECT_EQ(url_quote("a b/c", true), "a%20b/c");
  EXPECT_EQ(url_quote("refs/pr/1", false), "refs%2Fpr%2F1");
  HttpResponse r;
  r.status = 404;
  r.headers["x-error-code"] = "EntryNotFound";
  EXPECT_EQ(classify_hub_error(r), HubErrorKind::kEntryNotFound);
  r.headers["x-error-code"] = "GatedRepo";
  EXPECT_EQ(status_from_response(r, "http://h/x?sig=secret").code(), Code::kPermissionDenied);
  EXPECT_EQ(status_from_response(r, "http://h/x?sig=secret").message().find("secret"), std::string::npos);
  r.headers.clear();
  r.status = 401;
  EXPECT_EQ(classify_hub_error(r), HubErrorKind::kRepoNotFound);
  r.status = 503;
  EXPECT_EQ(status_from_response(r, "u").code(), Code::kUnavailable);
}

TEST(Http, CheckSecretNamesTheSourceNeverTheValue) {
  EXPECT_TRUE(check_secret("hf_abcdef", "HF_TOKEN").ok());
  for (std::string bad :
       {"hf_abc\r\nX-Injected: 1", "hf_abc\nsecond line", "hf\x01", "hf\x7f", "hf\xc2\x85", "hf\xff"}) {
    Status s = check_secret(bad, "HF_TOKEN");
    ASSERT_EQ(s.code(), Code::kInvalidArgument) << inert(bad);
    EXPECT_TRUE(contains(s.message(), "HF_TOKEN")) << s.message();
    EXPECT_FALSE(contains(s.to_string(), "hf_abc")) << s.to_string();
    EXPECT_FALSE(contains(s.to_string(), "Injected")) << s.to_string();
  }
}

// Nothing with a control character goes on the wire (an injected header), and
// no message shows a URL's password or signature.
TEST(Http, AHeaderOrUrlHoldingAControlCharacterIsNeverSent) {
  HttpOptions o;
  o.connect_timeout_s = 1;
  o.retry.max_attempts = 1;
  o.dead_host_window_s = 0;
  HttpClient c(o);
  HttpRequest r;
  r.url = "http://127.0.0.1:1/x";  // nothing listens: a request that went out would fail to connect instead
  r.headers = {{"Authorization", "Bearer tok\r\nX-Injected: 1"}};
  auto resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), Code::kInvalidArgument) << resp.status().to_string();
  EXPECT_TRUE(contains(resp.status().message(), "'Authorization'")) << resp.status().message();
  EXPECT_FALSE(contains(resp.status().to_string(), "tok")) << resp.status().to_string();
  r.headers.clear();
  r.url = "http://127.0.0.1:1/x\r\nX-Injected: 1";
  resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_EQ(resp.status().code(), Code::kInvalidArgument) << resp.status().to_string();
  EXPECT_FALSE(has_control_chars(resp.status().to_string()));
}

TEST(Http, MessagesNeverShowAUrlsPassword) {
  HttpOptions o;
  o.connect_timeout_s = 1;
  o.retry.max_attempts = 1;
  o.dead_host_window_s = 0;
  HttpClient c(o);
  HttpRequest r;
  r.url = "http://alice:s3cretpw@127.0.0.1:1/x?X-Amz-Signature=SIGSECRET";
  auto resp = c.request(r);
  ASSERT_FALSE(resp.ok());
  EXPECT_FALSE(contains(resp.status().to_string(), "s3cretpw")) << resp.status().to_string();
  EXPECT_FALSE(contains(resp.status().to_string(), "SIGSECRET")) << resp.status().to_string();
}

}  // namespace
}  // namespace wl

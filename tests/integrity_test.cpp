// Every door commits only bytes their source vouches for (docs/integrity.md),
// against our own hostile servers on loopback (tests/hostile/hostile_server.py):
// an HF-compatible mirror whose ETag is no hash and whose CDN serves other
// bytes of the right length; ModelScope updates, wrong bytes, absurd sizes and
// hostile revisions; S3/GCS checksums; listings that must stop. Runs in the
// release and the ASan+UBSan CTest passes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "hostile_fixture.h"
#include "test_util.h"
#include "weightlift/hash.h"
#include "weightlift/hub.h"
#include "weightlift/io.h"
#include "weightlift/s3.h"

namespace wl {
namespace {

namespace fs = std::filesystem;
using namespace hostile;  // NOLINT: the shared fixture of these tests
using testing::ScopedEnv;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every regular file below `dir` (recursive), relative names.
std::vector<std::string> files_below(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), dir).string());
  return out;
}

// The model the hostile server serves, fetched from its plain-HTTP case.
const std::string& model_bytes() {
  static const std::string bytes = [] {
    HttpClient c(fast());
    HttpRequest r;
    r.url = server().main("/http/ok/model.safetensors");
    auto resp = c.request(r);
    return resp.ok() ? resp->body : std::string();
  }();
  return bytes;
}

using Integrity = Hostile;

// ---- the Hub and its mirrors --------------------------------------------------------------------

TEST_F(Integrity, AMirrorWhoseEtagIsNoHashIsCheckedAgainstTheTreesLfsOid) {
  for (const char* c : {"mirror-md5", "mirror-multipart", "mirror-63hex"}) {
    const std::string cache = tmp_.file(c);
    SnapshotOptions s;
    auto r = snapshot_download("org/m", s, hub(c, cache));
    ASSERT_FALSE(r.ok()) << c << ": the mirror's other bytes were committed";
    EXPECT_EQ(r.status().code(), Code::kCorruptData) << r.status().to_string();
    EXPECT_TRUE(contains(r.status().message(),
                         "do not match the tree listing's lfs.oid " + sha256_hex(std::string_view(model_bytes()))))
        << r.status().to_string();
    for (const auto& f : files_below(cache))  // nothing under a final name holds the mirror's bytes
      EXPECT_FALSE(f.find("/blobs/") != std::string::npos && f.find(".incomplete") == std::string::npos &&
                   f.find(".ranges") == std::string::npos && slurp(cache + "/" + f).size() == model_bytes().size())
          << c << ": " << f;
    // One file, without a tree listing of the snapshot: the folder's listing (paths-info) vouches.
    auto one = hf_hub_download("org/m", "model.safetensors", "main", hub(c, tmp_.file(std::string(c) + "-one")));
    ASSERT_FALSE(one.ok()) << c;
    EXPECT_TRUE(contains(one.status().message(), "lfs.oid")) << one.status().to_string();
  }
  // The same mirror serving the right bytes: verified against lfs.oid, and committed.
  auto good = snapshot_download("org/m", {}, hub("mirror-md5-good", tmp_.file("good")));
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(slurp(*good + "/model.safetensors"), model_bytes());
}

TEST_F(Integrity, LoadingWhileDownloadingFromAMirrorFailsOnItsOtherBytes) {
  size_t n = 0;
  auto r = load_from_hub("org/m", "main", hub("mirror-md5", tmp_.file("c")), {}, [&](LoadedTensor&&) {
    ++n;
    return Status();
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruptData) << r.status().to_string();
  EXPECT_TRUE(contains(r.status().message(), "lfs.oid")) << r.status().to_string();
  // The CLI: exit 1, and `load --checksum` never prints the wrong tensors as a success.
  auto cli_r = cli(
      {"HF_ENDPOINT=" + server().main("/hub/mirror-md5"), "HF_HUB_CACHE=" + tmp_.file("cli"), "WEIGHTLIFT_RETRIES=1"},
      {"load", "org/m", "--checksum", "--format", "jsonl", "--no-progress"});
  EXPECT_EQ(cli_r.exit_code, 1) << cli_r.err;
  EXPECT_TRUE(contains(cli_r.err, "lfs.oid")) << cli_r.err;
}

TEST_F(Integrity, AHashEtagTheTreeContradictsIsRefused) {
  auto r = snapshot_download("org/m", {}, hub("mirror-contradict", tmp_.file("c")));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "contradicts itself")) << r.status().to_string();
}

TEST_F(Integrity, AFileNoSourceVouchesForIsWrittenAtomicallyAndSaidUnverified) {
  std::vector<std::string> log;
  HubOptions o = hub("mirror-nohash", tmp_.file("c"));
  o.log = [&](const std::string& line) { log.push_back(line); };
  SnapshotOptions s;
  s.allow_patterns = {"model.safetensors"};
  auto r = snapshot_download("org/m", s, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string all;
  for (const auto& l : log) all += l + "\n";
  EXPECT_TRUE(contains(all, "NOT verified")) << all;
  EXPECT_TRUE(contains(all, "model.safetensors")) << all;
}

TEST_F(Integrity, VerificationSwitchedOffIsSaidForEveryFile) {
  ScopedEnv off("WEIGHTLIFT_VERIFY", "0");  // docs/integrity.md: for a CPU that cannot hash as fast as it downloads
  std::vector<std::string> log;
  HubOptions o = hub("ok", tmp_.file("c"));
  o.log = [&](const std::string& line) { log.push_back(line); };
  auto r = snapshot_download("org/m", {}, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string all;
  for (const auto& l : log) all += l + "\n";
  EXPECT_TRUE(contains(all, "model.safetensors of org/m (revision main): NOT verified: verification is off")) << all;
  S3Case s3("sum-crc32c");
  auto d = download_model_files("s3://b/m/", tmp_.file("s3"), {});
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->unverified.size(), 1u);
}

// ---- ModelScope -----------------------------------------------------------------------------------

HubOptions modelscope(const std::string& c, const std::string& cache) {
  HubOptions o = hub(c, cache);
  o.endpoint = server().main("/ms/" + c);
  return o;
}

TEST_F(Integrity, ModelScopeReverifiesWhatItHasAndFetchesAStaleFileAgain) {
  const std::string cache = tmp_.file("ms");
  auto first = modelscope_snapshot_download("org/m", {}, modelscope("ok", cache));
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  const std::string file = *first + "/model.safetensors";
  EXPECT_EQ(slurp(file), model_bytes());
  // Warm: nothing fetched again, and the sidecar spares the rehash (the file's version is remembered).
  server().get("/_wl/log");
  ASSERT_TRUE(modelscope_snapshot_download("org/m", {}, modelscope("ok", cache)).ok());
  for (const auto& e : server().get("/_wl/log")) EXPECT_FALSE(contains(e.value("path", ""), "FilePath=")) << e.dump();
  ASSERT_FALSE(files_below(cache + "/.weightlift/verified").empty());
  // Updated upstream to other bytes of the same size: fetched again, never kept.
  std::vector<std::string> log;
  HubOptions o = modelscope("stale", cache);
  o.log = [&](const std::string& line) { log.push_back(line); };
  auto again = modelscope_snapshot_download("org/m", {}, o);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(*again, *first);
  EXPECT_NE(slurp(file), model_bytes());
  EXPECT_EQ(slurp(file).size(), model_bytes().size());
  ASSERT_FALSE(log.empty());
  EXPECT_TRUE(contains(log.front(), "is stale")) << log.front();
}

TEST_F(Integrity, ModelScopeBytesThatDoNotMatchTheirSha256NeverTakeTheName) {
  const std::string cache = tmp_.file("ms");
  auto r = modelscope_snapshot_download("org/m", {}, modelscope("wrong-bytes", cache));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorruptData);
  EXPECT_TRUE(contains(r.status().message(), "does not match its Sha256")) << r.status().to_string();
  for (const auto& f : files_below(cache)) EXPECT_FALSE(f.ends_with("model.safetensors")) << f;
}

TEST_F(Integrity, ModelScopeSizesAreAdmittedBeforeAByteIsWritten) {
  for (const char* c : {"size-2p62", "size-1e15", "size-neg"}) {
    server().get("/_wl/log");
    auto r = modelscope_snapshot_download("org/m", {}, modelscope(c, tmp_.file(c)));
    ASSERT_FALSE(r.ok()) << c;
    if (std::string(c) == "size-neg") {
      EXPECT_EQ(r.status().code(), Code::kCorruptData) << r.status().to_string();
      EXPECT_TRUE(contains(r.status().message(), "not a byte count")) << r.status().to_string();
    } else {
      EXPECT_EQ(r.status().code(), Code::kOutOfRange) << r.status().to_string();
      EXPECT_TRUE(contains(r.status().message(), "bytes free on the disk")) << r.status().to_string();
    }
    for (const auto& e : server().get("/_wl/log"))  // no file was asked for
      EXPECT_FALSE(contains(e.value("path", ""), "FilePath=")) << c << ": " << e.dump();
    for (const auto& f : files_below(tmp_.file(c))) EXPECT_FALSE(f.ends_with(".safetensors")) << f;
  }
}

TEST_F(Integrity, ModelScopeRevisionsAreCheckedAsTheHubs) {
  SnapshotOptions s;
  s.revision = "../../..";
  auto r = modelscope_snapshot_download("org/m", s, modelscope("ok", tmp_.file("ms/cache")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(contains(r.status().message(), "invalid revision")) << r.status().to_string();
  EXPECT_TRUE(files_below(tmp_.path()).empty());
  // Through the CLI as vLLM sets it up.
  auto c = cli(
      {"VLLM_USE_MODELSCOPE=1", "MODELSCOPE_DOMAIN=" + server().main("/ms/ok"), "MODELSCOPE_CACHE=" + tmp_.file("cli")},
      {"download", "org/m", "--revision", "../../.."});
  EXPECT_NE(c.exit_code, 0);
  EXPECT_TRUE(contains(c.err, "invalid revision")) << c.err;
  EXPECT_TRUE(files_below(tmp_.path()).empty());
}

// ---- object stores ------------------------------------------------------------------------------------

TEST_F(Integrity, ObjectStoreChecksumsVouchForADownload) {
  // Each algorithm a store offers, right: the copy is written; wrong: nothing under the name.
  for (const char* c : {"sum-crc32c", "sum-crc32", "sum-sha256", "goog", "ok"}) {
    S3Case s3(c);
    const std::string dir = tmp_.file(std::string("good-") + c);
    ModelDownloadOptions o;
    o.chunk_bytes = 64 << 10;  // several chunks, hashed in order while they pass
    o.threads = 4;
    auto r = download_model_files("s3://b/m/", dir, o);
    ASSERT_TRUE(r.ok()) << c << ": " << r.status().to_string();
    EXPECT_TRUE(r->unverified.empty()) << c;  // "ok": the single-part MD5 ETag
    EXPECT_EQ(slurp(dir + "/model.safetensors"), model_bytes()) << c;
  }
  for (const char* c : {"sum-crc32c-bad", "sum-crc32-bad", "sum-sha256-bad", "goog-bad", "etag-bad"}) {
    S3Case s3(c);
    const std::string dir = tmp_.file(std::string("bad-") + c);
    ModelDownloadOptions o;
    o.chunk_bytes = 64 << 10;
    auto r = download_model_files("s3://b/m/", dir, o);
    ASSERT_FALSE(r.ok()) << c;
    EXPECT_EQ(r.status().code(), Code::kCorruptData) << c;
    EXPECT_TRUE(contains(r.status().message(), "do not match")) << r.status().to_string();
    EXPECT_TRUE(files_below(dir).empty()) << c << ": " << files_below(dir).size();
  }
  // A multipart upload (its ETag and a composite checksum cover parts): written, and said unverified.
  for (const char* c : {"multipart", "composite"}) {
    S3Case s3(c);
    auto r = download_model_files("s3://b/m/", tmp_.file(c), {});
    ASSERT_TRUE(r.ok()) << c << ": " << r.status().to_string();
    EXPECT_EQ(r->unverified.size(), 1u) << c;
  }
  auto cl = cli(s3_env("multipart"), {"download", "s3://b/m/", tmp_.file("cli")});
  EXPECT_EQ(cl.exit_code, 0) << cl.err;
  EXPECT_TRUE(contains(cl.err, "NOT verified")) << cl.err;
}

// ---- listings ---------------------------------------------------------------------------------------

TEST_F(Integrity, ListingsStopWithinTheirTimeByDefault) {
  HttpOptions defaults;
  EXPECT_EQ(defaults.max_list_pages, 1000u);
  EXPECT_EQ(defaults.list_timeout_s, 60);
  // One new entry per page, forever: the listing's own time stops it (1 s here, 60 s by default).
  HubOptions o = hub("tree-endless-entries", tmp_.file("c"));
  o.http.list_timeout_s = 1;
  o.http.max_list_pages = 1000000;  // the time, not the page cap, ends it here
  const auto t0 = std::chrono::steady_clock::now();
  auto t = list_repo_tree("org/m", "main", "", true, o);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(contains(t.status().message(), "did not end within 1 s (WEIGHTLIFT_LIST_TIMEOUT)"))
      << t.status().to_string();
  EXPECT_LT(took, 30);
  {  // S3's endless listing, through the variable
    S3Case s3("endless-keys");
    ScopedEnv cap("WEIGHTLIFT_LIST_TIMEOUT", "1"), pages("WEIGHTLIFT_LIST_MAX_PAGES", "1000000");
    auto l = Env::Default()->list_dir("s3://b/m/");
    ASSERT_FALSE(l.ok());
    EXPECT_TRUE(contains(l.status().message(), "WEIGHTLIFT_LIST_TIMEOUT")) << l.status().to_string();
  }
  // The command's deadline applies to listings too.
  auto c = cli({"HF_ENDPOINT=" + server().main("/hub/tree-endless-entries"), "HF_HUB_CACHE=" + tmp_.file("cli")},
               {"download", "org/m", "--deadline", "1"});
  EXPECT_EQ(c.exit_code, 1) << c.err;
  EXPECT_TRUE(contains(c.err, "deadline") || contains(c.err, "WEIGHTLIFT_LIST_TIMEOUT")) << c.err;
}

}  // namespace
}  // namespace wl

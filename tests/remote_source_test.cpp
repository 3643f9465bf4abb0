// Remote sources seen from the engine, without a server: URL routing, the
// scatter read every file has, `auto` on URLs, configuration errors reaching
// the caller before any request is sent.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fake_system.h"
#include "test_util.h"
#include "weightlift/io.h"
#include "weightlift/loader.h"
#include "weightlift/prefetch.h"
#include "weightlift/weight_files.h"

namespace wl {
namespace {

using testing::FakeSystemInfo;
using testing::TempDir;
using testing::write_bytes;

using testing::ScopedEnv;

TEST(RemoteSource, ScatterReadOfALocalFileFillsEveryPart) {
  TempDir dir;
  write_bytes(dir.file("f"), "abcdefghij");
  auto f = Env::Default()->open(dir.file("f"), {.mode = FileMode::kPread});
  ASSERT_TRUE(f.ok());
  std::string a(3, '?'), b(0, '?'), c(4, '?');
  std::span<std::byte> parts[] = {std::as_writable_bytes(std::span(a.data(), a.size())),
                                  std::as_writable_bytes(std::span(b.data(), b.size())),
                                  std::as_writable_bytes(std::span(c.data(), c.size()))};
  ASSERT_TRUE((*f)->read_scatter_at(2, parts).ok());
  EXPECT_EQ(a, "cde");
  EXPECT_EQ(c, "fghi");
  std::string d(4, '?');
  std::span<std::byte> past[] = {std::as_writable_bytes(std::span(d.data(), d.size()))};
  EXPECT_EQ((*f)->read_scatter_at(8, past).code(), Code::kOutOfRange);
}

TEST(RemoteSource, AutoPicksStreamForUrlsWithoutAsking) {
  FakeSystemInfo sys;  // no /proc files at all: a URL must not need them
  for (const char* url : {"s3://b/m/model.safetensors", "gs://b/x.safetensors", "https://h/x.safetensors"}) {
    auto facts = file_facts({url}, /*env=*/nullptr, &sys);
    auto d = choose(ReadRequest{.source = SourceKind::kRemote, .first_file = url}, *facts);
    ASSERT_TRUE(d.ok()) << url << ": " << d.status().to_string();
    EXPECT_TRUE(d->strategy == Strategy::kStream) << url;
    EXPECT_FALSE(d->strategy == Strategy::kPrefetch);
    ASSERT_EQ(d->log.size(), 1u);
    EXPECT_NE(d->log[0].find("auto: stream ("), std::string::npos) << d->log[0];
  }
}

TEST(RemoteSource, MissingCredentialsAreReportedBeforeAnyRequest) {
  TempDir home;
  ScopedEnv h("HOME", home.path().c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", nullptr), secret("AWS_SECRET_ACCESS_KEY", nullptr), prof("AWS_PROFILE", nullptr);
  ScopedEnv cred("AWS_SHARED_CREDENTIALS_FILE", nullptr), conf("AWS_CONFIG_FILE", nullptr);
  ScopedEnv anon("AWS_NO_SIGN_REQUEST", nullptr);
  ScopedEnv ep("AWS_ENDPOINT_URL", "http://127.0.0.1:9");  // never contacted
  auto f = Env::Default()->open("s3://bucket/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), Code::kPermissionDenied);
  EXPECT_NE(f.status().message().find("no credentials for s3://"), std::string::npos) << f.status().to_string();
  // find_weight_files reports the source's reason, not a bare "not found".
  auto wf = find_weight_files("s3://bucket/model/");
  ASSERT_FALSE(wf.ok());
  EXPECT_EQ(wf.status().code(), Code::kPermissionDenied) << wf.status().to_string();
}

TEST(RemoteSource, BadUrlsAndPrefixesAreInvalidArguments) {
  ScopedEnv anon("AWS_NO_SIGN_REQUEST", "1");
  ScopedEnv ep("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
  auto upper = Env::Default()->open("s3://Bad_Bucket/x");
  ASSERT_FALSE(upper.ok());
  EXPECT_EQ(upper.status().code(), Code::kInvalidArgument);
  auto prefix = Env::Default()->open("s3://bucket/a/prefix/");
  ASSERT_FALSE(prefix.ok());
  EXPECT_EQ(prefix.status().code(), Code::kInvalidArgument);
  EXPECT_NE(prefix.status().message().find("not an object"), std::string::npos);
  auto write = Env::Default()->new_writable("s3://bucket/out.bin");
  EXPECT_EQ(write.status().code(), Code::kUnimplemented);
  auto listing = Env::Default()->list_dir("https://example.invalid/dir/");
  EXPECT_EQ(listing.status().code(), Code::kUnimplemented);
}

}  // namespace
}  // namespace wl

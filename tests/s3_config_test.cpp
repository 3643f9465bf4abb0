// Object storage without a server: URLs, configuration from the environment
// and the AWS shared files, request URLs, and hostile XML.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "s3/s3_xml.h"
#include "test_util.h"
#include "weightlift/s3.h"

namespace wl {
namespace {

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

using testing::TempDir;
using testing::write_bytes;

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(S3Url, SplitsBucketAndKey) {
  auto u = parse_s3_url("s3://my-bucket/models/llama/model.safetensors");
  ASSERT_TRUE(u.ok()) << u.status().to_string();
  EXPECT_EQ(u->scheme, "s3");
  EXPECT_EQ(u->bucket, "my-bucket");
  EXPECT_EQ(u->key, "models/llama/model.safetensors");
  auto root = parse_s3_url("gs://bucket.with.dots");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->scheme, "gs");
  EXPECT_EQ(root->key, "");
  auto prefix = parse_s3_url("s3://b_1/p/");
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(prefix->key, "p/");
}

TEST(S3Url, RejectsMalformedUrls) {
  for (const char* bad : {"s3://", "s3:///key", "s3://UPPER/key", "s3://bad bucket/k", "http://host/x", "bucket/key",
                          "s3://b/key\nwith-newline"}) {
    auto u = parse_s3_url(bad);
    EXPECT_FALSE(u.ok()) << bad;
    if (!u.ok()) EXPECT_EQ(u.status().code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(parse_s3_url("s3://" + std::string(223, 'b') + "/k").ok());
  EXPECT_FALSE(parse_s3_url("s3://b/" + std::string(1025, 'k')).ok());
  EXPECT_TRUE(parse_s3_url("s3://b/" + std::string(1024, 'k')).ok());
}

TEST(S3Config, EnvironmentKeysRegionAndEndpoint) {
  auto c = resolve_s3_config("s3", fake_env({{"AWS_ACCESS_KEY_ID", "AKID"},
                                             {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                             {"AWS_SESSION_TOKEN", "TOKEN"},
                                             {"AWS_DEFAULT_REGION", "eu-west-1"},
                                             {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}}));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->credentials);
  EXPECT_EQ(c->credentials->access_key_id, "AKID");
  EXPECT_EQ(c->credentials->session_token, "TOKEN");
  EXPECT_EQ(c->region, "eu-west-1");
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(c->addressing, S3Addressing::kPath);  // a custom endpoint: path-style
  EXPECT_EQ(c->credentials_source, "the environment (AWS_ACCESS_KEY_ID)");
}

TEST(S3Config, EndpointOrderAndTheStreamersVariables) {
  std::map<std::string, std::string> vars = {{"AWS_ACCESS_KEY_ID", "a"},
                                             {"AWS_SECRET_ACCESS_KEY", "b"},
                                             {"AWS_REGION", "us-west-2"},
                                             {"AWS_DEFAULT_REGION", "eu-west-1"},
                                             {"AWS_ENDPOINT_URL", "http://general:1"},
                                             {"AWS_ENDPOINT_URL_S3", "http://s3-only:2"}};
  auto c = resolve_s3_config("s3", fake_env(vars));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "http://s3-only:2");
  EXPECT_EQ(c->region, "us-west-2");
  vars["RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL"] = "runai-host:3";
  vars["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] = "1";
  c = resolve_s3_config("s3", fake_env(vars));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "https://runai-host:3");
  EXPECT_EQ(c->addressing, S3Addressing::kVirtual);
}

TEST(S3Config, DefaultAwsEndpointIsVirtualHosted) {
  auto c = resolve_s3_config("s3", fake_env({{"AWS_ACCESS_KEY_ID", "a"}, {"AWS_SECRET_ACCESS_KEY", "b"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(c->addressing, S3Addressing::kVirtual);
  EXPECT_EQ(s3_request_url(*c, "models", "llama/a b+c.json"),
            "https://models.s3.us-east-1.amazonaws.com/llama/a%20b%2Bc.json");
  // Dots in the name would break the wildcard certificate: path-style.
  EXPECT_EQ(s3_request_url(*c, "my.models", "k"), "https://s3.us-east-1.amazonaws.com/my.models/k");
}

TEST(S3Config, ListQueryIsSortedAndEncoded) {
  S3Config c;
  c.endpoint = "http://127.0.0.1:8333/base";
  c.addressing = S3Addressing::kPath;
  EXPECT_EQ(
      s3_request_url(c, "b", "",
                     {{"prefix", "llama/"}, {"list-type", "2"}, {"delimiter", "/"}, {"continuation-token", "a+b/c="}}),
      "http://127.0.0.1:8333/base/b?continuation-token=a%2Bb%2Fc%3D&delimiter=%2F&list-type=2&prefix=llama%2F");
}

TEST(S3Config, ProfilesFromTheSharedFiles) {
  TempDir dir;
  write_bytes(dir.path() + "/credentials",
              "# comment\n[default]\naws_access_key_id = DEF\naws_secret_access_key = DEFSECRET\n\n"
              "[dev]\naws_access_key_id=DEVKEY\naws_secret_access_key = DEVSECRET\naws_session_token = T\n");
  write_bytes(dir.path() + "/config",
              "[default]\nregion = ap-south-1\n[profile dev]\nregion = eu-central-1\n"
              "endpoint_url = http://minio:9000\ns3 =\n  addressing_style = virtual\n");
  std::map<std::string, std::string> vars = {{"AWS_SHARED_CREDENTIALS_FILE", dir.path() + "/credentials"},
                                             {"AWS_CONFIG_FILE", dir.path() + "/config"}};
  auto c = resolve_s3_config("s3", fake_env(vars));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials->access_key_id, "DEF");
  EXPECT_EQ(c->region, "ap-south-1");
  vars["AWS_PROFILE"] = "dev";
  c = resolve_s3_config("s3", fake_env(vars));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->credentials->access_key_id, "DEVKEY");
  EXPECT_EQ(c->credentials->session_token, "T");
  EXPECT_EQ(c->region, "eu-central-1");
  EXPECT_EQ(c->endpoint, "http://minio:9000");
  EXPECT_NE(c->credentials_source.find("profile 'dev' in "), std::string::npos);
  EXPECT_EQ(c->credentials_source.find("DEVSECRET"), std::string::npos);
  // Environment keys win over the files.
  vars["AWS_ACCESS_KEY_ID"] = "ENV";
  vars["AWS_SECRET_ACCESS_KEY"] = "ENVSECRET";
  c = resolve_s3_config("s3", fake_env(vars));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->credentials->access_key_id, "ENV");
  EXPECT_EQ(c->credentials->session_token, "");
}

TEST(S3Config, ErrorsNameWhatToSet) {
  TempDir dir;
  auto none = resolve_s3_config("s3", fake_env({{"HOME", dir.path()}}));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kPermissionDenied);
  EXPECT_NE(none.status().message().find("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"), std::string::npos);

  auto half = resolve_s3_config("s3", fake_env({{"AWS_ACCESS_KEY_ID", "only-the-id"}}));
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.status().message(), "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");

  auto profile = resolve_s3_config("s3", fake_env({{"HOME", dir.path()}, {"AWS_PROFILE", "ghost"}}));
  ASSERT_FALSE(profile.ok());
  EXPECT_EQ(profile.status().code(), Code::kNotFound);
  EXPECT_NE(profile.status().message().find("AWS profile 'ghost' is in neither"), std::string::npos);

  auto endpoint = resolve_s3_config("s3", fake_env({{"AWS_ENDPOINT_URL", "ftp://x"}, {"AWS_NO_SIGN_REQUEST", "1"}}));
  ASSERT_FALSE(endpoint.ok());
  EXPECT_NE(endpoint.status().message().find("(from AWS_ENDPOINT_URL) is not an http(s) URL"), std::string::npos);

  auto region =
      resolve_s3_config("s3", fake_env({{"AWS_REGION", "us-east-1\r\nX-Evil: 1"}, {"AWS_NO_SIGN_REQUEST", "1"}}));
  EXPECT_FALSE(region.ok());

  auto anon = resolve_s3_config("s3", fake_env({{"AWS_NO_SIGN_REQUEST", "true"}, {"HOME", dir.path()}}));
  ASSERT_TRUE(anon.ok());
  EXPECT_TRUE(anon->anonymous);
  EXPECT_FALSE(anon->credentials);
}

TEST(S3Config, GcsHmacKeysAndBearerToken) {
  auto hmac = resolve_s3_config("gs", fake_env({{"GS_ACCESS_KEY_ID", "GOOG1"},
                                                {"GS_SECRET_ACCESS_KEY", "s"},
                                                {"AWS_ACCESS_KEY_ID", "not-for-google"},
                                                {"AWS_SECRET_ACCESS_KEY", "x"}}));
  ASSERT_TRUE(hmac.ok()) << hmac.status().to_string();
  EXPECT_EQ(hmac->endpoint, "https://storage.googleapis.com");
  EXPECT_EQ(hmac->region, "auto");
  EXPECT_EQ(hmac->credentials->access_key_id, "GOOG1");
  EXPECT_EQ(s3_request_url(*hmac, "bkt", "m/x.safetensors"), "https://storage.googleapis.com/bkt/m/x.safetensors");
  auto bearer = resolve_s3_config("gs", fake_env({{"GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.token"}}));
  ASSERT_TRUE(bearer.ok());
  EXPECT_EQ(bearer->bearer_token, "ya29.token");
  EXPECT_FALSE(bearer->credentials);
  auto none = resolve_s3_config("gs", fake_env({}));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("GS_ACCESS_KEY_ID"), std::string::npos);
}

// ---- XML ----

std::string page(const std::string& body, bool truncated = false, const std::string& token = "") {
  return "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
         "<IsTruncated>" +
         std::string(truncated ? "true" : "false") + "</IsTruncated>" +
         (token.empty() ? "" : "<NextContinuationToken>" + token + "</NextContinuationToken>") + body +
         "</ListBucketResult>";
}

TEST(S3Config, ACredentialHoldingAControlCharacterIsRefusedNamingTheVariable) {
  TempDir dir;
  struct Case {
    std::string scheme;
    std::map<std::string, std::string> vars;
    std::string named;
  };
  const std::string home = dir.path();
  for (const Case& c :
       {Case{"s3", {{"AWS_ACCESS_KEY_ID", "AK\x1bID"}, {"AWS_SECRET_ACCESS_KEY", "s"}}, "AWS_ACCESS_KEY_ID"},
        Case{"s3", {{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "s\tx"}}, "AWS_SECRET_ACCESS_KEY"},
        Case{"s3",
             {{"AWS_ACCESS_KEY_ID", "AKID"}, {"AWS_SECRET_ACCESS_KEY", "s"}, {"AWS_SESSION_TOKEN", "t\r\nX: 1"}},
             "AWS_SESSION_TOKEN"},
        Case{"gs", {{"GS_ACCESS_KEY_ID", "GK\nID"}, {"GS_SECRET_ACCESS_KEY", "s"}}, "GS_ACCESS_KEY_ID"},
        Case{"gs", {{"GOOGLE_OAUTH_ACCESS_TOKEN", "ya29\x7f"}}, "GOOGLE_OAUTH_ACCESS_TOKEN"}}) {
    SCOPED_TRACE(c.named);
    auto vars = c.vars;
    vars["HOME"] = home;
    auto r = resolve_s3_config(c.scheme, fake_env(vars));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(contains(r.status().message(), c.named)) << r.status().message();
  }
}

TEST(S3Xml, ParsesAListPage) {
  auto p = s3::parse_list_objects_v2(page("<Contents><Key>m/a.safetensors</Key><Size>123</Size></Contents>"
                                          "<Contents><Key>m/&lt;odd&amp;name&gt;</Key><Size>0</Size></Contents>"
                                          "<CommonPrefixes><Prefix>m/sub/</Prefix></CommonPrefixes>",
                                          true, "tok=="),
                                     "s3://b/m/");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->objects.size(), 2u);
  EXPECT_EQ(p->objects[0].key, "m/a.safetensors");
  EXPECT_EQ(p->objects[0].size, 123u);
  EXPECT_EQ(p->objects[1].key, "m/<odd&name>");
  EXPECT_EQ(p->prefixes, std::vector<std::string>{"m/sub/"});
  EXPECT_TRUE(p->truncated);
  EXPECT_EQ(p->next_token, "tok==");
}

TEST(S3Xml, HostileListingsAreCorruptNamingTheUrl) {
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "<a>";
  const std::string laughs =
      "<?xml version=\"1.0\"?><!DOCTYPE l [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;\">]>"
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&b;</Key><Size>1</Size></Contents>"
      "</ListBucketResult>";
  std::string many;
  for (size_t i = 0; i <= s3::kMaxEntriesPerPage; ++i) many += "<Contents><Key>k</Key><Size>1</Size></Contents>";
  const std::pair<std::string, std::string> cases[] = {
      {"", "not XML"},
      {"<html>503</html>", "root element is 'html'"},
      {"<ListBucketResult><IsTruncated>false</IsTruncated>", "not XML"},
      {page("<Contents><Size>1</Size></Contents>"),
       "entry 1 of the page has no readable Key: <Contents><Size>1</Size>"},
      // A key the parser cannot read as text is named, not dropped.
      {page("<Contents><Key><b>model</b>.safetensors</Key><Size>1</Size></Contents>"),
       "has no readable Key: <Contents><Key><b>model</b>.safetensors</Key>"},
      {"<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
       "<Contents><Key>m/bad%zz</Key><Size>1</Size></Contents></ListBucketResult>",
       "key 'm/bad%zz' is not valid URL encoding"},
      {page("<Contents><Key>k</Key><Size>-1</Size></Contents>"), "has size '-1'"},
      {page("<Contents><Key>k</Key><Size>99999999999999999999999</Size></Contents>"), "has size"},
      {page("<Contents><Key>k</Key><Size>12abc</Size></Contents>"), "has size '12abc'"},
      {page("<Contents><Key>k</Key></Contents>"), "has size ''"},
      {page("<Contents><Key>" + std::string(1025, 'k') + "</Key><Size>1</Size></Contents>"), "a key of 1025 bytes"},
      {page("<Contents><Key>a&#10;b</Key><Size>1</Size></Contents>"), "holds control characters"},
      {page(""), ""},  // fine
      {page("", true), "truncated page without NextContinuationToken"},
      {page("<IsTruncated>maybe</IsTruncated>"), "IsTruncated is 'maybe'"},
      {page(many), "more than 10000 entries in one page"},
      {nested, "not XML"},
      {laughs, ""},  // entities are not expanded: at most the literal text
  };
  for (const auto& [xml, want] : cases) {
    auto p = s3::parse_list_objects_v2(xml, "s3://b/p/");
    if (want.empty()) {
      EXPECT_TRUE(p.ok()) << xml.substr(0, 80) << ": " << p.status().to_string();
      if (p.ok())
        for (const auto& o : p->objects) EXPECT_LT(o.key.size(), 200u);
      continue;
    }
    ASSERT_FALSE(p.ok()) << xml.substr(0, 300);
    EXPECT_EQ(p.status().code(), Code::kCorruptData);
    EXPECT_EQ(p.status().file(), "s3://b/p/");
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status().message();
  }
  std::string huge(s3::kMaxXmlBytes + 1, ' ');
  auto p = s3::parse_list_objects_v2(huge, "s3://b/p/");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("more than the"), std::string::npos);
}

TEST(S3Xml, UrlEncodedKeysAreDecoded) {
  // Servers may answer with EncodingType=url (we never ask): keys and prefixes come percent-encoded.
  auto p = s3::parse_list_objects_v2(
      "<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
      "<Contents><Key>m%2Fmodel-00001.safetensors</Key><Size>5</Size></Contents>"
      "<Contents><Key>m/with+space.json</Key><Size>1</Size></Contents>"
      "<CommonPrefixes><Prefix>m%2Fsub%2F</Prefix></CommonPrefixes></ListBucketResult>",
      "s3://b/m/");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->objects.size(), 2u);
  EXPECT_EQ(p->objects[0].key, "m/model-00001.safetensors");
  EXPECT_EQ(p->objects[1].key, "m/with space.json");
  EXPECT_EQ(p->prefixes, std::vector<std::string>{"m/sub/"});
  // A control character hidden in the encoding is refused like a literal one.
  auto c = s3::parse_list_objects_v2(
      "<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated>"
      "<Contents><Key>m/a%0Ab</Key><Size>5</Size></Contents></ListBucketResult>",
      "s3://b/m/");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("holds control characters"), std::string::npos) << c.status().message();
}

TEST(S3Xml, ErrorBodies) {
  auto e = s3::parse_error_body(
      "<?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we "
      "calculated does not match\x01</Message><Region>eu-west-1</Region></Error>");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "SignatureDoesNotMatch");
  EXPECT_EQ(e->message, "The request signature we calculated does not match\\x01");  // inert (text.h)
  EXPECT_EQ(e->region, "eu-west-1");
  EXPECT_FALSE(s3::parse_error_body(""));
  EXPECT_FALSE(s3::parse_error_body("<html><body>Forbidden</body></html>"));
  EXPECT_FALSE(s3::parse_error_body("<Error></Error>"));
  auto long_msg =
      s3::parse_error_body("<Error><Code>X</Code><Message>" + std::string(5000, 'm') + "</Message></Error>");
  ASSERT_TRUE(long_msg);
  EXPECT_LE(long_msg->message.size(), 515u);
}

}  // namespace
}  // namespace wl

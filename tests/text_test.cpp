// Outside text made inert and secrets redacted (text.h): the functions
// themselves, and Status, which keeps its text inert.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "weightlift/status.h"
#include "weightlift/text.h"

namespace wl {
namespace {

bool contains(const std::string& s, std::string_view sub) { return s.find(sub) != std::string::npos; }

// No byte a terminal acts on: C0 (but none at all, not even LF), DEL, C1 in
// UTF-8, the bidi and line controls.
bool is_inert(const std::string& s) { return !has_control_chars(s); }

TEST(Inert, EscapesEveryControlCharacterVisibly) {
  EXPECT_EQ(inert("a\x1b]0;pwned\x07z"), "a\\x1b]0;pwned\\x07z");
  EXPECT_EQ(inert("line\nnext\rtab\t"), "line\\x0anext\\x0dtab\\x09");
  EXPECT_EQ(inert(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(inert("del\x7f"), "del\\x7f");
  EXPECT_EQ(inert("c1\xc2\x9b"
                  "31m"),
            "c1\\u009b31m");  // U+009B, CSI as one character
  EXPECT_EQ(inert("bidi\xe2\x80\xae"
                  "txt"),
            "bidi\\u202etxt");                          // U+202E, right-to-left override
  EXPECT_EQ(inert("iso\xe2\x81\xa6x"), "iso\\u2066x");  // U+2066
  EXPECT_EQ(inert("bad\xff\xfe"), "bad\\xff\\xfe");     // not UTF-8
  EXPECT_EQ(inert("\xc0\xaf"), "\\xc0\\xaf");           // overlong
  EXPECT_EQ(inert("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(inert("cut\xe2\x82"), "cut\\xe2\\x82");     // a sequence cut short
}

TEST(Inert, LeavesPrintableTextAlone) {
  for (std::string s : {"model.layers.0.self_attn.q_proj.weight", "模型/权重.safetensors", "naïve café ß",
                        "emoji \xf0\x9f\x98\x80", "a\\x1b stays as written", "100% [x] {y} (z) 'q' \"d\""})
    EXPECT_EQ(inert(s), s);
}

TEST(Inert, IsIdempotentAndAlwaysInert) {
  std::mt19937_64 rng(30);
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 0x20 : rng());
    if (i % 5 == 0) s = "http://u:p@h/x?sig=" + s + "&token=" + s;
    const std::string once = inert(s);
    EXPECT_TRUE(is_inert(once)) << once;
    EXPECT_EQ(inert(once), once);
  }
}

TEST(Inert, RedactsUrlUserinfo) {
  EXPECT_EQ(inert("GET http://alice:s3cret@host:8080/path failed"), "GET http://***@host:8080/path failed");
  EXPECT_EQ(inert("https://token@github.com/x"), "https://***@github.com/x");
  EXPECT_EQ(inert("(http://a:b@h) and (https://c:d@i/)"), "(http://***@h) and (https://***@i/)");
  EXPECT_EQ(inert("http://host/path/@not-userinfo"), "http://host/path/@not-userinfo");
  EXPECT_EQ(inert("mail me at a@b.example"), "mail me at a@b.example");
  EXPECT_FALSE(contains(inert("endpoint 'http://alice:s3cret@h' (from HF_ENDPOINT)"), "s3cret"));
}

TEST(Inert, RedactsPresignedQueryParameters) {
  const std::string url =
      "https://b.s3.amazonaws.com/m.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20260101"
      "&X-Amz-Date=20260101T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FwoGZX"
      "&X-Amz-Signature=deadbeef";
  const std::string shown = inert(url);
  EXPECT_FALSE(contains(shown, "deadbeef"));
  EXPECT_FALSE(contains(shown, "AKIA"));
  EXPECT_FALSE(contains(shown, "FwoGZX"));
  EXPECT_TRUE(contains(shown, "X-Amz-Signature=***"));
  EXPECT_TRUE(contains(shown, "X-Amz-Date=20260101T000000Z"));  // what is not a secret stays readable
  for (std::string p : {"Signature", "sig", "token", "access_token", "X-Goog-Signature", "X-Goog-Credential",
                        "AWSAccessKeyId", "api_key", "key", "x-amz-signature", "SIG"})
    EXPECT_EQ(inert("https://h/f?" + p + "=SECRET&a=1"), "https://h/f?" + p + "=***&a=1") << p;
  EXPECT_EQ(inert("https://h/f?a=1&sig=SECRET)"), "https://h/f?a=1&sig=***)");
  EXPECT_EQ(inert("https://h/f?max-keys=10&prefix=m/"), "https://h/f?max-keys=10&prefix=m/");
}

TEST(Inert, ACutNeverShowsAPartOfASecretOrASplitCharacter) {
  const std::string s = "https://h/f?X-Amz-Signature=0123456789abcdef0123456789abcdef";
  const size_t full = inert(s).size();  // "https://h/f?X-Amz-Signature=***"
  for (size_t max = 0; max < s.size(); ++max) {
    const std::string shown = inert(s, max);
    EXPECT_FALSE(contains(shown, "0123")) << shown;
    EXPECT_LE(shown.size(), max + 3) << shown;
    EXPECT_EQ(shown.ends_with("..."), max < full) << shown;
  }
  EXPECT_EQ(inert("模型", 4), "模...");
  EXPECT_EQ(inert("a\x1b[2Jbbbb", 3), "a...");  // never half an escape
}

TEST(Inert, HasControlCharsMatchesWhatIsEscaped) {
  EXPECT_FALSE(has_control_chars("config.json"));
  EXPECT_FALSE(has_control_chars("模型.json"));
  for (const std::string& s : std::vector<std::string>{"a\nb", "a\rb", "a\tb",
                                                       "a\x1b"
                                                       "b",
                                                       "a\x7f"
                                                       "b",
                                                       "a\xc2\x85"
                                                       "b",
                                                       "a\xe2\x80\x8f"
                                                       "b",
                                                       "a\xff"
                                                       "b",
                                                       std::string("a\0b", 3)})
    EXPECT_TRUE(has_control_chars(s)) << inert(s);
}

TEST(Inert, AStatusIsInertByConstruction) {
  Status s = Status::Corrupt("ETag '\x1b[31mred' from http://u:pw@h/x?X-Amz-Signature=SIG")
                 .with_file("dir/\x1b]0;t\x07.safetensors")
                 .with_tensor("w\n.evil");
  EXPECT_TRUE(is_inert(s.message()));
  EXPECT_TRUE(is_inert(s.file()));
  EXPECT_TRUE(is_inert(s.tensor()));
  const std::string all = s.to_string();
  EXPECT_TRUE(is_inert(all));
  EXPECT_FALSE(contains(all, "pw@"));
  EXPECT_FALSE(contains(all, "=SIG"));
  EXPECT_TRUE(contains(all, "\\x1b[31mred")) << all;
  EXPECT_TRUE(contains(all, "tensor 'w\\x0a.evil'")) << all;
  EXPECT_TRUE(is_inert(Status::FromErrno(2,
                                         "cannot open a\x1b"
                                         "b")
                           .to_string()));
}

}  // namespace
}  // namespace wl

// Which CA bundle the HTTP client hands libcurl when the caller names none
// (src/http/ca_bundle.h): libcurl's own default where it exists, else the
// distribution's.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "http/ca_bundle.h"

namespace wl {
namespace {

auto only(std::set<std::string> present) {
  return [present = std::move(present)](const std::string& p) { return present.count(p) > 0; };
}

TEST(CaBundle, KeepsLibcurlsDefaultWhereItExists) {
  EXPECT_EQ(pick_ca_bundle("/etc/ssl/certs/ca-certificates.crt", only({"/etc/ssl/certs/ca-certificates.crt"})), "");
}

TEST(CaBundle, FindsTheDistributionsBundleWhereLibcurlsIsAbsent) {
  // Debian's libcurl on RHEL: its default path does not exist there.
  EXPECT_EQ(pick_ca_bundle("/etc/ssl/certs/ca-certificates.crt", only({"/etc/pki/tls/certs/ca-bundle.crt"})),
            "/etc/pki/tls/certs/ca-bundle.crt");
  EXPECT_EQ(pick_ca_bundle(nullptr, only({"/etc/ssl/cert.pem"})), "/etc/ssl/cert.pem");
  EXPECT_EQ(pick_ca_bundle("", only({"/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"})), "/etc/ssl/ca-bundle.pem");
}

TEST(CaBundle, NoneAnywhereLeavesLibcurlAlone) { EXPECT_EQ(pick_ca_bundle("/nonexistent/ca.crt", only({})), ""); }

}  // namespace
}  // namespace wl

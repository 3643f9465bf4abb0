#include "http/ca_bundle.h"

#include <curl/curl.h>
#include <unistd.h>

namespace wl {

std::string pick_ca_bundle(const char* curl_default, const std::function<bool(const std::string&)>& exists) {
  if (curl_default && *curl_default && exists(curl_default)) return "";
  // The places Linux distributions keep their bundle (as Go's crypto/x509 looks).
  static const char* const kKnown[] = {
      "/etc/ssl/certs/ca-certificates.crt",                 // Debian, Ubuntu, Gentoo, Arch
      "/etc/pki/tls/certs/ca-bundle.crt",                   // Fedora, RHEL
      "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  // CentOS, RHEL 7+
      "/etc/ssl/ca-bundle.pem",                             // openSUSE
      "/etc/pki/tls/cacert.pem",                            // OpenELEC
      "/etc/ssl/cert.pem",                                  // Alpine
  };
  for (const char* path : kKnown)
    if (exists(path)) return path;
  return "";
}

const std::string& system_ca_bundle() {
  static const std::string bundle = [] {
    const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
    return pick_ca_bundle(info ? info->cainfo : nullptr,
                          [](const std::string& p) { return ::access(p.c_str(), R_OK) == 0; });
  }();
  return bundle;
}

}  // namespace wl

// Private: which CA bundle TLS peers are checked against when the caller
// names none. libcurl's built-in default is the path of the system it was
// built on (Debian: /etc/ssl/certs/ca-certificates.crt); the binary wheel
// carries Debian's libcurl to distributions whose bundle lies elsewhere.
#pragma once

#include <functional>
#include <string>

namespace wl {

// "" when `curl_default` (libcurl's built-in CA file, may be null) exists: keep
// libcurl's default. Otherwise the first well-known system bundle that exists
// (Debian/Ubuntu, Fedora/RHEL, openSUSE, Alpine, ...), or "" when none does.
std::string pick_ca_bundle(const char* curl_default, const std::function<bool(const std::string&)>& exists);

// pick_ca_bundle() for this process's libcurl and filesystem, decided once.
const std::string& system_ca_bundle();

}  // namespace wl

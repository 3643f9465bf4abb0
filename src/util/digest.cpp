// Digest: OpenSSL's EVP digests and ISA-L's CRCs behind one interface.
#include "util/digest.h"

#include "weightlift/hash.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace wl {

struct Digest::Impl {
  EVP_MD_CTX* md = nullptr;  // SHA-256, SHA-1, MD5
  enum class Crc { kNone, k32c, k32 } crc = Crc::kNone;
  uint32_t state = 0;
  ~Impl() {
    if (md) EVP_MD_CTX_free(md);
  }
};

Digest::Digest(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Digest::Digest(Digest&&) noexcept = default;
Digest& Digest::operator=(Digest&&) noexcept = default;
Digest::~Digest() = default;

std::optional<Digest> Digest::make(const std::string& algorithm) {
  auto impl = std::make_unique<Impl>();
  const EVP_MD* md = algorithm == "sha256" ? EVP_sha256()
                     : algorithm == "sha1" ? EVP_sha1()
                     : algorithm == "md5"  ? EVP_md5()
                                           : nullptr;
  if (md) {
    impl->md = EVP_MD_CTX_new();
    if (!impl->md || EVP_DigestInit_ex(impl->md, md, nullptr) != 1) return std::nullopt;
  } else if (algorithm == "crc32c") {
    impl->crc = Impl::Crc::k32c;
    impl->state = 0xFFFFFFFFu;  // crc32_iscsi carries the register, inverted at the ends
  } else if (algorithm == "crc32") {
    impl->crc = Impl::Crc::k32;  // crc32_gzip_refl inverts itself, as zlib's crc32
  } else {
    return std::nullopt;
  }
  return Digest(std::move(impl));
}

void Digest::update(std::span<const std::byte> data) {
  auto* p = reinterpret_cast<unsigned char*>(const_cast<std::byte*>(data.data()));
  size_t n = data.size();
  if (impl_->md) {
    EVP_DigestUpdate(impl_->md, p, n);
    return;
  }
  while (n > 0) {  // crc32_iscsi takes an int length
    const size_t k = std::min<size_t>(n, size_t{1} << 30);
    if (impl_->crc == Impl::Crc::k32c)
      impl_->state = crc32_iscsi(p, static_cast<int>(k), impl_->state);
    else
      impl_->state = crc32_gzip_refl(impl_->state, p, k);
    p += k;
    n -= k;
  }
}

std::string Digest::hex() {
  if (impl_->md) {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(impl_->md, out, &n);
    return fmt::format("{:02x}", fmt::join(out, out + n, ""));
  }
  const uint32_t v = impl_->crc == Impl::Crc::k32c ? impl_->state ^ 0xFFFFFFFFu : impl_->state;
  return fmt::format("{:08x}", v);
}

bool verify_downloads() {
  const char* v = std::getenv("WEIGHTLIFT_VERIFY");
  return !(v && std::string_view(v) == "0");
}

std::string base64_to_hex(const std::string& b64) {
  if (b64.empty() || b64.size() % 4 != 0 || b64.size() > 512) return {};
  unsigned char out[512];
  const int n = EVP_DecodeBlock(out, reinterpret_cast<const unsigned char*>(b64.data()), static_cast<int>(b64.size()));
  if (n < 0) return {};
  int len =
      n - static_cast<int>(std::count(b64.end() - 2, b64.end(), '='));  // EVP_DecodeBlock keeps the padding's zeros
  return fmt::format("{:02x}", fmt::join(out, out + std::max(len, 0), ""));
}

}  // namespace wl

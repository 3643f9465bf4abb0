#include <openssl/evp.h>

#include <fmt/format.h>

#include "weightlift/hash.h"

namespace wl {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) { reset(); }
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::reset() { EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr); }

void Sha256::update(std::span<const std::byte> data) {
  if (!data.empty()) EVP_DigestUpdate(impl_->ctx, data.data(), data.size());
}

std::array<unsigned char, 32> Sha256::digest() {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, out.data(), &len);
  return out;
}

std::string Sha256::hex_digest() {
  auto d = digest();
  std::string s;
  s.reserve(64);
  for (unsigned char c : d) s += fmt::format("{:02x}", c);
  return s;
}

std::string sha256_hex(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

std::string sha256_hex(std::string_view text) { return sha256_hex(std::as_bytes(std::span(text.data(), text.size()))); }

}  // namespace wl

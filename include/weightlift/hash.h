// weightlift/hash.h: SHA-256 (OpenSSL libcrypto) for checksums, LFS ETags and lock names.
// Not thread-safe per object; use one Sha256 per thread.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace wl {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(std::span<const std::byte> data);
  void update(std::string_view text) { update(std::as_bytes(std::span(text.data(), text.size()))); }
  std::array<unsigned char, 32> digest();  // finishes; the object may then be reset()
  std::string hex_digest();                // lower-case hex of digest()
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view text);

// Whether downloads check their bytes against the hash their source vouches
// for (docs/integrity.md): on unless WEIGHTLIFT_VERIFY is "0" (for a machine
// whose CPU cannot hash as fast as its network delivers; every file is then
// logged NOT verified). Read at each call.
bool verify_downloads();

}  // namespace wl

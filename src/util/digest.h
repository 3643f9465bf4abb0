// Private: the hashes sources vouch for a file with (docs/integrity.md),
// computed incrementally by libraries: OpenSSL (SHA-256, SHA-1, MD5) and
// Intel ISA-L (CRC-32C as GCS and S3 give it, CRC-32 as S3 gives it; both
// with the CPU's CRC instructions where it has them).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace wl {

// One running hash. Not thread-safe; move-only.
class Digest {
 public:
  // "sha256", "sha1", "md5", "crc32c", "crc32"; nullopt for another name.
  static std::optional<Digest> make(const std::string& algorithm);
  Digest(Digest&&) noexcept;
  Digest& operator=(Digest&&) noexcept;
  ~Digest();
  void update(std::span<const std::byte> data);
  // Lower-case hex of the digest (a CRC as its 4 bytes big-endian, the way
  // the stores encode it); finishes the hash.
  std::string hex();

 private:
  struct Impl;
  explicit Digest(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Base64 (RFC 4648, padded) -> lower-case hex; "" when `b64` is not base64.
std::string base64_to_hex(const std::string& b64);

}  // namespace wl

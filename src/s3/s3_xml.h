// Private: the XML of S3 answers (ListObjectsV2 pages and error bodies),
// parsed with tinyxml2 under size bounds. The server is not trusted: every
// count, length and number is checked before it is used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "weightlift/status.h"

namespace wl::s3 {

inline constexpr uint64_t kMaxXmlBytes = uint64_t{16} << 20;  // a page of 1000 keys is ~0.3 MiB
inline constexpr size_t kMaxEntriesPerPage = 10000;           // S3 sends at most 1000
inline constexpr size_t kMaxKeyBytes = 1024;                  // S3's own limit
inline constexpr size_t kMaxTokenBytes = 4096;

struct ListedObject {
  std::string key;
  uint64_t size = 0;
};

struct ListPage {
  std::vector<ListedObject> objects;  // Contents
  std::vector<std::string> prefixes;  // CommonPrefixes
  bool truncated = false;
  std::string next_token;  // NextContinuationToken (non-empty when truncated)
};

// One ListObjectsV2 page. kCorruptData naming `where` for anything that is not
// a well-formed ListBucketResult within the bounds above.
Result<ListPage> parse_list_objects_v2(std::string_view xml, const std::string& where);

struct ErrorBody {
  std::string code;     // "NoSuchKey", "SignatureDoesNotMatch", ...
  std::string message;  // inert (text.h), cut to 512 bytes
  std::string region;   // <Region>, when the server says where the bucket is
};
// An <Error> document; nullopt for anything else (empty, HTML, malformed).
std::optional<ErrorBody> parse_error_body(std::string_view xml);

}  // namespace wl::s3

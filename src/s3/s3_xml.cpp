#include "s3/s3_xml.h"

#include <charconv>
#include <optional>

#include <fmt/format.h>
#include <tinyxml2.h>

#include "weightlift/text.h"

namespace wl::s3 {

namespace {

using tinyxml2::XMLElement;

std::string_view text_of(const XMLElement* e) {
  const char* t = e ? e->GetText() : nullptr;
  return t ? std::string_view(t) : std::string_view();
}

// Values that are not names (booleans, sizes, codes) may be pretty-printed.
std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\r' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

Status corrupt(const std::string& where, const std::string& what) {
  return Status::Corrupt("malformed ListObjectsV2 answer: " + what).with_file(where);
}

// %XX decoding of a key a server sent with <EncodingType>url</EncodingType>.
std::optional<std::string> url_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      unsigned v = 0;
      auto [p, ec] = std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16);
      if (ec != std::errc() || p != s.data() + i + 3) return std::nullopt;
      out.push_back(static_cast<char>(v));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

bool parse_doc(tinyxml2::XMLDocument& doc, std::string_view xml) {
  return doc.Parse(xml.data(), xml.size()) == tinyxml2::XML_SUCCESS;
}

}  // namespace

Result<ListPage> parse_list_objects_v2(std::string_view xml, const std::string& where) {
  if (xml.size() > kMaxXmlBytes)
    return corrupt(where, fmt::format("{} bytes, more than the {} accepted", xml.size(), kMaxXmlBytes));
  tinyxml2::XMLDocument doc(true, tinyxml2::PRESERVE_WHITESPACE);  // keys keep their spaces
  if (!parse_doc(doc, xml)) return corrupt(where, fmt::format("not XML ({})", doc.ErrorName()));
  const XMLElement* root = doc.RootElement();
  if (!root || std::string_view(root->Name()) != "ListBucketResult")
    return corrupt(where,
                   fmt::format("root element is '{}', not ListBucketResult", root ? inert(root->Name(), 64) : ""));
  ListPage page;
  size_t entries = 0;
  // Keys and prefixes as the server encoded them (we never ask for an encoding, some servers send one).
  const bool encoded = trimmed(text_of(root->FirstChildElement("EncodingType"))) == "url";
  auto decoded = [&](std::string_view raw, std::string* out) -> Status {
    if (!encoded) {
      *out = std::string(raw);
      return Status();
    }
    auto d = url_decode(raw);
    if (!d)
      return corrupt(where, fmt::format("key '{}' is not valid URL encoding (EncodingType url)", inert(raw, 128)));
    *out = std::move(*d);
    return Status();
  };
  for (const XMLElement* e = root->FirstChildElement(); e; e = e->NextSiblingElement()) {
    std::string_view name = e->Name();
    if (name == "Contents" || name == "CommonPrefixes") {
      if (++entries > kMaxEntriesPerPage)
        return corrupt(where, fmt::format("more than {} entries in one page", kMaxEntriesPerPage));
    }
    if (name == "IsTruncated") {
      std::string_view t = trimmed(text_of(e));
      if (t != "true" && t != "false") return corrupt(where, fmt::format("IsTruncated is '{}'", inert(t, 32)));
      page.truncated = t == "true";
    } else if (name == "NextContinuationToken") {
      std::string_view t = text_of(e);
      if (t.size() > kMaxTokenBytes || has_control_chars(t))
        return corrupt(where, fmt::format("continuation token of {} bytes", t.size()));
      page.next_token = std::string(t);
    } else if (name == "Contents") {
      const XMLElement* k = e->FirstChildElement("Key");
      std::string_view raw = text_of(k);
      std::string_view size = trimmed(text_of(e->FirstChildElement("Size")));
      if (raw.empty()) {  // name what there is rather than drop the entry
        tinyxml2::XMLPrinter pr(nullptr, /*compact=*/true);
        e->Accept(&pr);
        return corrupt(where,
                       fmt::format("entry {} of the page has no readable Key: {}", entries,
                                   inert(std::string_view(pr.CStr(), pr.CStrSize() ? pr.CStrSize() - 1 : 0), 200)));
      }
      std::string key;
      WL_RETURN_IF_ERROR(decoded(raw, &key));
      if (key.size() > kMaxKeyBytes) return corrupt(where, fmt::format("a key of {} bytes", key.size()));
      if (has_control_chars(key))
        return corrupt(where, fmt::format("key '{}' holds control characters", inert(key, 128)));
      ListedObject o;
      auto [p, ec] = std::from_chars(size.data(), size.data() + size.size(), o.size);
      if (size.empty() || ec != std::errc() || p != size.data() + size.size() || size.front() == '-')
        return corrupt(where, fmt::format("key '{}' has size '{}'", inert(key, 128), inert(size, 32)));
      o.key = std::move(key);
      page.objects.push_back(std::move(o));
    } else if (name == "CommonPrefixes") {
      std::string pre;
      WL_RETURN_IF_ERROR(decoded(text_of(e->FirstChildElement("Prefix")), &pre));
      if (pre.empty() || pre.size() > kMaxKeyBytes || has_control_chars(pre))
        return corrupt(where, fmt::format("a common prefix '{}' of {} bytes", inert(pre, 128), pre.size()));
      page.prefixes.push_back(std::move(pre));
    }
  }
  if (page.truncated && page.next_token.empty()) return corrupt(where, "truncated page without NextContinuationToken");
  return page;
}

std::optional<ErrorBody> parse_error_body(std::string_view xml) {
  if (xml.empty() || xml.size() > kMaxXmlBytes) return std::nullopt;
  tinyxml2::XMLDocument doc(true, tinyxml2::PRESERVE_WHITESPACE);  // keys keep their spaces
  if (!parse_doc(doc, xml)) return std::nullopt;
  const XMLElement* root = doc.RootElement();
  if (!root || std::string_view(root->Name()) != "Error") return std::nullopt;
  ErrorBody b;
  b.code = inert(trimmed(text_of(root->FirstChildElement("Code"))), 64);
  b.message = inert(trimmed(text_of(root->FirstChildElement("Message"))), 512);
  b.region = inert(trimmed(text_of(root->FirstChildElement("Region"))), 64);
  if (b.code.empty() && b.message.empty()) return std::nullopt;
  return b;
}

}  // namespace wl::s3

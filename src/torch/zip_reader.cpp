#include "torch/zip_reader.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "util/checked.h"

namespace wl::zip {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZip64EocdSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint64_t kEocdSize = 22;
constexpr uint64_t kMaxComment = 0xFFFF;
constexpr uint64_t kMaxEntries = 10'000'000;
constexpr uint64_t kMaxCentralDir = uint64_t{1} << 30;

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
uint64_t le64(const unsigned char* p) { return uint64_t{le32(p)} | (uint64_t{le32(p + 4)} << 32); }

Status corrupt(const std::string& path, std::string what) {
  return Status::Corrupt("not a valid zip archive: " + what).with_file(path);
}

Status read_range(const RandomAccessFile& f, uint64_t off, uint64_t n, std::string* out) {
  uint64_t end = 0;
  if (!checked_add(off, n, &end) || end > f.size())
    return Status::Corrupt(
               fmt::format("zip range [{}, +{}) lies past the end of the file ({} bytes)", off, n, f.size()))
        .with_file(f.path());
  out->resize(n);
  return f.read_at(off, std::as_writable_bytes(std::span(out->data(), out->size())));
}

// Where the central directory lies, as the end records give it.
struct Directory {
  uint64_t entries = 0;
  uint64_t size = 0;
  uint64_t offset = 0;
  uint64_t end_record = 0;  // offset of the end-of-central-directory record
};

// 1. The end-of-central-directory record, scanning the tail backwards: the
// last one whose comment reaches exactly the end of the file, else the last one.
Result<Directory> read_end_record(const RandomAccessFile& file) {
  const std::string& path = file.path();
  const uint64_t fsize = file.size();
  uint64_t tail_len = std::min<uint64_t>(fsize, kEocdSize + kMaxComment);
  std::string tail;
  WL_RETURN_IF_ERROR(read_range(file, fsize - tail_len, tail_len, &tail));
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data());
  int64_t pos = -1;
  for (int64_t i = static_cast<int64_t>(tail_len - kEocdSize); i >= 0; --i) {
    if (le32(t + i) == kEocdSig && le16(t + i + 20) == tail_len - kEocdSize - static_cast<uint64_t>(i)) {
      pos = i;
      break;
    }
  }
  if (pos < 0) {
    for (int64_t i = static_cast<int64_t>(tail_len - kEocdSize); i >= 0; --i)
      if (le32(t + i) == kEocdSig) {
        pos = i;
        break;
      }
  }
  if (pos < 0) return corrupt(path, "no end-of-central-directory record (truncated or not a zip file)");
  const unsigned char* e = t + pos;
  if (le16(e + 4) != 0 || le16(e + 6) != 0)
    return Status::Unimplemented("multi-disk zip archives are not supported").with_file(path);
  Directory d;
  d.end_record = fsize - tail_len + static_cast<uint64_t>(pos);
  d.entries = le16(e + 10);
  d.size = le32(e + 12);
  d.offset = le32(e + 16);
  return d;
}

// 2. Zip64: a locator 20 bytes before the end record points at the zip64 end
// record, whose counts replace the saturated ones.
Status read_zip64_end_record(const RandomAccessFile& file, Directory* d) {
  const std::string& path = file.path();
  if (d->end_record < 20) return Status();
  std::string loc;
  WL_RETURN_IF_ERROR(read_range(file, d->end_record - 20, 20, &loc));
  const auto* l = reinterpret_cast<const unsigned char*>(loc.data());
  if (le32(l) != kZip64LocatorSig) {
    if (d->entries == 0xFFFF || d->size == 0xFFFFFFFF || d->offset == 0xFFFFFFFF)
      return corrupt(path, "zip64 markers without a zip64 end-of-central-directory locator");
    return Status();
  }
  uint64_t z64_off = le64(l + 8);
  std::string rec;
  if (z64_off > d->end_record - 20 || d->end_record - 20 - z64_off < 56)
    return corrupt(path, fmt::format("zip64 end record offset {} is out of range", z64_off));
  WL_RETURN_IF_ERROR(read_range(file, z64_off, 56, &rec));
  const auto* r = reinterpret_cast<const unsigned char*>(rec.data());
  if (le32(r) != kZip64EocdSig) return corrupt(path, "bad zip64 end-of-central-directory signature");
  d->entries = le64(r + 32);
  d->size = le64(r + 40);
  d->offset = le64(r + 48);
  return Status();
}

// 3. The directory lies before its end record, and its size bounds the entries.
Status check_directory(const std::string& path, const Directory& d) {
  uint64_t cd_end = 0;
  if (!checked_add(d.offset, d.size, &cd_end) || cd_end > d.end_record)
    return corrupt(path, fmt::format("central directory [{}, +{}) does not fit before its end record at {}", d.offset,
                                     d.size, d.end_record));
  if (d.size > kMaxCentralDir) return corrupt(path, fmt::format("central directory of {} bytes is too large", d.size));
  if (d.entries > kMaxEntries || d.entries > d.size / 46)
    return corrupt(path, fmt::format("{} entries cannot fit a {}-byte central directory", d.entries, d.size));
  return Status();
}

// Zip64 extended information of entry `en` (`x`: its extra fields): only the
// fields that are saturated in the entry appear, in this order.
Status read_zip64_extra(const std::string& path, const unsigned char* x, uint64_t extra_len, Entry* en) {
  bool need_u = en->size == 0xFFFFFFFF, need_c = en->compressed_size == 0xFFFFFFFF,
       need_o = en->header_offset == 0xFFFFFFFF;
  uint64_t xi = 0;
  while (xi + 4 <= extra_len) {
    uint16_t id = le16(x + xi), len = le16(x + xi + 2);
    if (xi + 4 + len > extra_len)
      return corrupt(path, fmt::format("zip entry '{}' has a truncated extra field", en->name));
    if (id == 0x0001) {
      const unsigned char* f = x + xi + 4;
      uint64_t fi = 0;
      auto take = [&](uint64_t* v) -> bool {
        if (fi + 8 > len) return false;
        *v = le64(f + fi);
        fi += 8;
        return true;
      };
      if ((need_u && !take(&en->size)) || (need_c && !take(&en->compressed_size)) ||
          (need_o && !take(&en->header_offset)))
        return corrupt(path, fmt::format("zip entry '{}' has a short zip64 extra field", en->name));
      need_u = need_c = need_o = false;
    }
    xi += 4 + len;
  }
  if (need_u || need_c || need_o)
    return corrupt(path, fmt::format("zip entry '{}' has zip64 markers but no zip64 extra field", en->name));
  return Status();
}

// Central directory entry `k`, at byte `p` of the directory `cd`: fills `en`
// (all but data_offset) and returns the entry's size in the directory.
Result<uint64_t> read_central_entry(const std::string& path, const std::string& cd, uint64_t p, uint64_t k, Entry* en) {
  const auto* c = reinterpret_cast<const unsigned char*>(cd.data());
  const uint64_t cd_size = cd.size();
  if (cd_size - p < 46 || le32(c + p) != kCentralSig)
    return corrupt(path, fmt::format("central directory entry {} is truncated or has a bad signature", k));
  uint16_t flags = le16(c + p + 8);
  en->method = le16(c + p + 10);
  en->compressed_size = le32(c + p + 20);
  en->size = le32(c + p + 24);
  uint64_t name_len = le16(c + p + 28), extra_len = le16(c + p + 30), comment_len = le16(c + p + 32);
  en->header_offset = le32(c + p + 42);
  if (cd_size - p - 46 < name_len + extra_len + comment_len)
    return corrupt(path, fmt::format("central directory entry {} runs past the directory", k));
  en->name.assign(reinterpret_cast<const char*>(c + p + 46), name_len);
  if (flags & 1) return Status::Unimplemented(fmt::format("zip entry '{}' is encrypted", en->name)).with_file(path);
  WL_RETURN_IF_ERROR(read_zip64_extra(path, c + p + 46 + name_len, extra_len, en));
  return 46 + name_len + extra_len + comment_len;
}

// The local header of `en`: its own name and extra lengths decide where the
// data starts (en->data_offset), and the data must end before the directory.
Status read_local_header(const RandomAccessFile& file, const Directory& dir, Entry* en) {
  const std::string& path = file.path();
  const uint64_t cd_off = dir.offset;
  std::string lh;
  if (en->header_offset > cd_off || cd_off - en->header_offset < 30)
    return corrupt(path, fmt::format("zip entry '{}' has a local header offset {} outside the data area", en->name,
                                     en->header_offset));
  WL_RETURN_IF_ERROR(read_range(file, en->header_offset, 30, &lh));
  const auto* h = reinterpret_cast<const unsigned char*>(lh.data());
  if (le32(h) != kLocalSig)
    return corrupt(path, fmt::format("zip entry '{}' has a bad local header signature", en->name));
  uint64_t lname = le16(h + 26), lextra = le16(h + 28);
  if (lname != en->name.size())
    return corrupt(path, fmt::format("zip entry '{}': local and central names differ", en->name));
  uint64_t data = en->header_offset + 30 + lname + lextra, data_end = 0;
  if (!checked_add(data, en->compressed_size, &data_end) || data_end > cd_off)
    return corrupt(path, fmt::format("zip entry '{}' ([{}, +{}) bytes) runs past the data area (file of {} bytes; "
                                     "truncated?)",
                                     en->name, data, en->compressed_size, file.size()));
  std::string lnm;
  WL_RETURN_IF_ERROR(read_range(file, en->header_offset + 30, lname, &lnm));
  if (lnm != en->name) return corrupt(path, fmt::format("zip entry '{}': local and central names differ", en->name));
  if (en->method == 0 && en->size != en->compressed_size)
    return corrupt(path, fmt::format("stored zip entry '{}' has different sizes ({} vs {})", en->name, en->size,
                                     en->compressed_size));
  en->data_offset = data;
  return Status();
}

}  // namespace

const Entry* Archive::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

Result<std::string> Archive::read(const Entry& e, uint64_t max_size) const {
  if (e.method != 0)
    return Status::Unimplemented(
               fmt::format("zip entry '{}' is compressed (method {}); only stored entries are supported", e.name,
                           e.method))
        .with_file(file_->path());
  if (e.size > max_size)
    return Status::Corrupt(
               fmt::format("zip entry '{}' declares {} bytes, more than the limit of {}", e.name, e.size, max_size))
        .with_file(file_->path());
  std::string out;
  WL_RETURN_IF_ERROR(read_range(*file_, e.data_offset, e.size, &out));
  return out;
}

Result<Archive> Archive::open(std::shared_ptr<RandomAccessFile> file) {
  const std::string& path = file->path();
  if (file->size() < kEocdSize) return corrupt(path, fmt::format("the file is only {} bytes", file->size()));
  WL_ASSIGN_OR_RETURN(Directory dir, read_end_record(*file));
  WL_RETURN_IF_ERROR(read_zip64_end_record(*file, &dir));
  WL_RETURN_IF_ERROR(check_directory(path, dir));

  std::string cd;
  WL_RETURN_IF_ERROR(read_range(*file, dir.offset, dir.size, &cd));
  Archive ar;
  ar.file_ = file;
  ar.entries_.reserve(dir.entries);
  uint64_t p = 0;
  for (uint64_t k = 0; k < dir.entries; ++k) {
    Entry en;
    WL_ASSIGN_OR_RETURN(uint64_t used, read_central_entry(path, cd, p, k, &en));
    p += used;
    WL_RETURN_IF_ERROR(read_local_header(*file, dir, &en));
    if (!ar.by_name_.emplace(en.name, ar.entries_.size()).second)
      return corrupt(path, fmt::format("duplicate zip entry '{}'", en.name));
    ar.entries_.push_back(std::move(en));
  }
  return ar;
}

}  // namespace wl::zip

// A small, strict reader of the zip archives that torch.save writes (private).
//
// Only what PyTorch checkpoints need: the central directory (zip64 included),
// entry names, sizes and the absolute offset of each entry's bytes, so that
// stored (uncompressed) records can be mapped zero-copy. Every offset and size
// read from the file is checked against the file size with overflow checks
// before it is used; nothing is allocated from an unchecked size.
// Thread-safety: immutable after open().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;  // 0 = stored
  uint64_t compressed_size = 0;
  uint64_t size = 0;           // uncompressed
  uint64_t header_offset = 0;  // local file header
  uint64_t data_offset = 0;    // absolute offset of the entry's bytes (validated)
};

class Archive {
 public:
  // Reads and validates the central directory and every local header.
  static Result<Archive> open(std::shared_ptr<RandomAccessFile> file);

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(std::string_view name) const;
  const std::shared_ptr<RandomAccessFile>& file() const { return file_; }

  // The bytes of a stored entry (read into a string; for small records such as data.pkl).
  // `max_size` bounds what is read; larger entries are refused.
  Result<std::string> read(const Entry& e, uint64_t max_size) const;

 private:
  std::shared_ptr<RandomAccessFile> file_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace wl::zip

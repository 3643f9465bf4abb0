// An in-memory Env for the fuzz targets: files are strings, so one execution
// costs no system call. Not thread-safe (libFuzzer runs one input at a time).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "weightlift/io.h"

namespace wl::fuzz {

class MemFile final : public RandomAccessFile {
 public:
  MemFile(std::string path, std::string data, bool mappable)
      : path_(std::move(path)), data_(std::move(data)), mappable_(mappable) {}
  const std::string& path() const override { return path_; }
  uint64_t size() const override { return data_.size(); }
  Status read_at(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > data_.size() || dst.size() > data_.size() - offset)
      return Status::OutOfRange("read past the end").with_file(path_);
    if (!dst.empty()) std::memcpy(dst.data(), data_.data() + offset, dst.size());
    return Status();
  }
  Result<std::span<const std::byte>> view(uint64_t offset, uint64_t n) const override {
    if (!mappable_) return RandomAccessFile::view(offset, n);
    if (offset > data_.size() || n > data_.size() - offset)
      return Status::OutOfRange("view past the end").with_file(path_);
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(data_.data()) + offset, n);
  }

 private:
  std::string path_;
  std::string data_;
  bool mappable_;
};

class MemEnv final : public Env {
 public:
  bool mappable = true;
  std::map<std::string, std::string> files;  // full path -> bytes
  std::vector<std::string> dirs;

  Result<std::shared_ptr<RandomAccessFile>> open(const std::string& path, const OpenOptions& o) override {
    auto it = files.find(path);
    if (it == files.end()) return Status::NotFound("no such file").with_file(path);
    return std::shared_ptr<RandomAccessFile>(
        std::make_shared<MemFile>(path, it->second, mappable && o.mode == FileMode::kMmap));
  }
  Result<uint64_t> file_size(const std::string& path) override {
    auto it = files.find(path);
    if (it == files.end()) return Status::NotFound("no such file").with_file(path);
    return uint64_t{it->second.size()};
  }
  bool exists(const std::string& path) override { return files.count(path) || is_directory(path); }
  bool is_directory(const std::string& path) override {
    for (auto& d : dirs)
      if (d == path) return true;
    return false;
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    if (!is_directory(path)) return Status::NotFound("no such directory").with_file(path);
    std::vector<DirEntry> out;
    std::string prefix = path + "/";
    for (auto& [p, _] : files)
      if (p.compare(0, prefix.size(), prefix) == 0 && p.find('/', prefix.size()) == std::string::npos)
        out.push_back({p.substr(prefix.size()), false, false});
    return out;
  }
};

// Aborts (a crash libFuzzer reports) when an invariant of the library is broken.
#define WL_FUZZ_CHECK(cond)                                                  \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                               \
    }                                                                        \
  } while (0)

}  // namespace wl::fuzz

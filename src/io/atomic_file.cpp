// AtomicFile: a temporary beside the final name, renamed over it on commit,
// all through the Env (so fault injection covers every write).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "weightlift/io.h"

namespace wl {

namespace {

// Six random characters for a temporary name (mkstemp's alphabet).
std::string random_suffix() {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static std::atomic<uint64_t> counter{0};
  std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32) ^ counter.fetch_add(1) ^
                      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string s(6, 'x');
  for (char& c : s) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
  return s;
}

}  // namespace

Result<AtomicFile> AtomicFile::create(const std::string& final_path, unsigned mode, Env* env) {
  if (final_path.empty()) return Status::InvalidArgument("empty output path");
  if (env == nullptr) return Status::InvalidArgument("AtomicFile needs an Env").with_file(final_path);
  for (int attempt = 0;; ++attempt) {
    std::string tmp = final_path + ".tmp." + random_suffix();
    auto f = env->new_writable(tmp, {.mode = mode, .truncate = true, .exclusive = true});
    if (f.ok()) return AtomicFile(env, final_path, tmp, std::move(*f));
    if (f.status().code() != Code::kAlreadyExists || attempt >= 100)
      return Status(f.status().code(), "cannot create temporary file: " + f.status().message()).with_file(final_path);
  }
}

AtomicFile::AtomicFile(AtomicFile&& o) noexcept
    : env_(o.env_), final_path_(std::move(o.final_path_)), temp_path_(std::move(o.temp_path_)),
      file_(std::move(o.file_)), committed_(o.committed_) {
  o.committed_ = true;  // the moved-from object owns nothing to clean up
}

AtomicFile::~AtomicFile() {
  if (file_) (void)file_->close();
  if (!committed_ && !temp_path_.empty() && env_) (void)env_->remove(temp_path_);
}

Status AtomicFile::write_at(uint64_t offset, std::span<const std::byte> data) {
  if (!file_) return Status::Internal("write after commit").with_file(final_path_);
  Status s = file_->write_at(offset, data);
  if (!s.ok()) return Status(s.code(), s.message()).with_file(final_path_);
  return s;
}

Status AtomicFile::append(std::span<const std::byte> data) {
  if (!file_) return Status::Internal("write after commit").with_file(final_path_);
  Status s = file_->append(data);
  if (!s.ok()) return Status(s.code(), s.message()).with_file(final_path_);
  return s;
}

Status AtomicFile::resize(uint64_t size) {
  if (!file_) return Status::Internal("resize after commit").with_file(final_path_);
  Status s = file_->truncate(size);
  if (!s.ok()) return Status(s.code(), s.message()).with_file(final_path_);
  return s;
}

Status AtomicFile::commit(bool sync) {
  if (!file_) return Status::Internal("commit twice").with_file(final_path_);
  auto fail = [&](const Status& s) { return Status(s.code(), s.message()).with_file(final_path_); };
  if (sync) {
    if (Status s = file_->sync(); !s.ok()) return fail(s);
  }
  if (Status s = file_->close(); !s.ok()) return fail(s);
  file_.reset();
  if (Status s = env_->rename(temp_path_, final_path_); !s.ok())
    return Status(s.code(), "cannot rename temporary file into place: " + s.message()).with_file(final_path_);
  committed_ = true;
  if (sync) (void)env_->sync_dir(parent_dir(final_path_));
  return Status();
}

}  // namespace wl

#include "weightlift/checkpoint.h"

#include <fmt/format.h>

#include "weightlift/safetensors.h"

namespace wl {

namespace {

class SafetensorsCheckpoint final : public CheckpointReader {
 public:
  explicit SafetensorsCheckpoint(std::shared_ptr<SafetensorsFile> f) : f_(std::move(f)) {
    for (const TensorInfo& t : f_->tensors()) tensors_.push_back({TensorMeta(t), t.offset});
  }
  const std::string& path() const override { return f_->path(); }
  std::string_view format_name() const override { return "safetensors"; }
  std::string version() const override { return f_->file()->version(); }
  const std::vector<CheckpointTensor>& tensors() const override { return tensors_; }
  Result<TensorView> view(size_t i) const override {
    if (i >= tensors_.size()) return Status::OutOfRange("tensor index out of range").with_file(path());
    return f_->get(tensors_[i].name);
  }
  Result<Tensor> read(size_t i) const override {
    if (i >= tensors_.size()) return Status::OutOfRange("tensor index out of range").with_file(path());
    return f_->read(tensors_[i].name);
  }

 private:
  std::shared_ptr<SafetensorsFile> f_;
  std::vector<CheckpointTensor> tensors_;
};

}  // namespace

Result<std::unique_ptr<CheckpointReader>> open_safetensors_checkpoint(const std::string& path, Env* env) {
  WL_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(path, FileMode::kMmap, env));
  return std::unique_ptr<CheckpointReader>(std::make_unique<SafetensorsCheckpoint>(std::move(f)));
}

Result<std::unique_ptr<CheckpointReader>> open_checkpoint(const std::string& path, Env* env) {
  if (std::string_view(path).ends_with(".safetensors")) return open_safetensors_checkpoint(path, env);
  if (std::string_view(path).ends_with(".bin") || std::string_view(path).ends_with(".pt") ||
      std::string_view(path).ends_with(".pth"))
    return open_pytorch_checkpoint(path, env);
  if (std::string_view(path).ends_with(".npy")) return open_numpy_checkpoint(path, env);
  // Unknown extension: sniff the first bytes.
  WL_ASSIGN_OR_RETURN(auto f, env->open(path, {.mode = FileMode::kPread}));
  std::byte head[8] = {};
  if (f->size() >= 8) WL_RETURN_IF_ERROR(f->read_at(0, head));
  if (f->size() >= 4 && head[0] == std::byte{'P'} && head[1] == std::byte{'K'})
    return open_pytorch_checkpoint(path, env);
  if (f->size() >= 6 && head[0] == std::byte{0x93} && head[1] == std::byte{'N'})
    return open_numpy_checkpoint(path, env);
  if (f->size() >= 2 && head[0] == std::byte{0x80}) return open_pytorch_checkpoint(path, env);  // legacy pickle
  return open_safetensors_checkpoint(path, env);
}

}  // namespace wl

// safetensors as a weight-file format (weightlift/safetensors.h, format.h):
// a CheckpointReader over a mapped SafetensorsFile, and the format's record.
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

const CheckpointFormat& safetensors_format() {
  static constexpr std::string_view kExtensions[] = {".safetensors"};
  static const CheckpointFormat kFormat{
      WeightFormat::kSafetensors, "safetensors", kExtensions, {}, &open_safetensors_checkpoint};
  return kFormat;
}

}  // namespace wl

// Placeholder until the PyTorch reader lands (issue: PyTorch .bin/.pt checkpoints).
#include "weightlift/checkpoint.h"

namespace wl {
Result<std::unique_ptr<CheckpointReader>> open_pytorch_checkpoint(const std::string& path, Env*) {
  return Status::Unimplemented("PyTorch checkpoints are not supported by this build").with_file(path);
}
}  // namespace wl

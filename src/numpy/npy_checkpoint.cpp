// Placeholder until the NumPy reader lands (issue: PyTorch .bin/.pt checkpoints, NumPy caches).
#include "weightlift/checkpoint.h"

namespace wl {
Result<std::unique_ptr<CheckpointReader>> open_numpy_checkpoint(const std::string& path, Env*) {
  return Status::Unimplemented(".npy files are not supported by this build").with_file(path);
}
}  // namespace wl

// The format registry (weightlift/checkpoint.h): one table of the records
// the formats declare, and open_checkpoint(), which asks it.
#include "weightlift/checkpoint.h"

#include "weightlift/npy.h"
#include "weightlift/safetensors.h"
#include "weightlift/torch.h"

namespace wl {

std::span<const CheckpointFormat* const> checkpoint_formats() {
  // A new format: its record here, one line.
  static const CheckpointFormat* const kFormats[] = {&safetensors_format(), &pytorch_format(), &numpy_format()};
  return kFormats;
}

const CheckpointFormat* checkpoint_format_for_name(std::string_view path) {
  for (const CheckpointFormat* f : checkpoint_formats())
    if (f->claims_name(path)) return f;
  return nullptr;
}

const CheckpointFormat* checkpoint_format_for_head(std::span<const std::byte> head) {
  for (const CheckpointFormat* f : checkpoint_formats())
    if (f->claims_head(head)) return f;
  return nullptr;
}

Result<std::unique_ptr<CheckpointReader>> open_checkpoint(const std::string& path, Env* env) {
  if (const CheckpointFormat* f = checkpoint_format_for_name(path)) return f->open(path, env);
  // No known extension: the magic of the first bytes.
  WL_ASSIGN_OR_RETURN(auto file, env->open(path, {.mode = FileMode::kPread}));
  std::byte head[kCheckpointMagicBytes] = {};
  if (file->size() >= kCheckpointMagicBytes) {
    WL_RETURN_IF_ERROR(file->read_at(0, head));
    if (const CheckpointFormat* f = checkpoint_format_for_head(head)) return f->open(path, env);
  }
  return safetensors_format().open(path, env);
}

}  // namespace wl

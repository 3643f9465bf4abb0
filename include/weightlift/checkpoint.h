// weightlift/checkpoint.h: every weight-file format the library reads, behind
// one reader interface (CheckpointReader, format.h), so that `ls`, `load`, the
// engine and the Python package treat them alike: the registry of formats,
// and open_checkpoint(), which picks one for a file.
//
// The registry is one table (src/checkpoint/checkpoint.cpp) of the records
// the formats declare in their own headers; it stands above them, and no
// format calls it.
//
// Thread-safety: the functions are reentrant; the records are immutable.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "weightlift/format.h"
#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl {

// Every format the library reads: safetensors, PyTorch (zip and legacy), NumPy
// .npy. No two claim the same extension or magic.
std::span<const CheckpointFormat* const> checkpoint_formats();

// The format whose extension `path` ends with; nullptr when none.
const CheckpointFormat* checkpoint_format_for_name(std::string_view path);
// The format whose magic `head` (the first bytes of a file) starts with; nullptr when none.
const CheckpointFormat* checkpoint_format_for_head(std::span<const std::byte> head);

// How many first bytes of a file open_checkpoint() compares with the magics.
inline constexpr size_t kCheckpointMagicBytes = 8;

// Opens any supported weight file. Its format comes from its extension
// (.safetensors, .bin/.pt/.pth, .npy), failing that from the magic of its
// first kCheckpointMagicBytes bytes (a shorter file has none); a file that
// neither names is read as safetensors, whose header starts with a length,
// not a magic.
Result<std::unique_ptr<CheckpointReader>> open_checkpoint(const std::string& path, Env* env = Env::Default());

}  // namespace wl

// Private: the POSIX descriptor behind a local file, for the one component
// that must hand it to another library (src/gpu: cuFileHandleRegister). The
// public seam (io.h) has no fd(): everything else reads through read_at().
#pragma once

#include "weightlift/io.h"

namespace wl::io {

// The descriptor of a file opened by the POSIX Env (Env::Default() for a
// local path): the O_DIRECT one when `prefer_direct` and the file has one.
// -1 for any other RandomAccessFile (URLs, wrappers in tests). The
// descriptor belongs to `file` and lives as long as it does.
int posix_fd(const RandomAccessFile& file, bool prefer_direct);

}  // namespace wl::io

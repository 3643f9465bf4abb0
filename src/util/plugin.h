// Private: loading weightlift's optional libraries (libweightlift_cuda.so,
// libweightlift_mpi.so) at run time, so that one build serves machines with
// and without CUDA or MPI.
#pragma once

#include <string>

namespace wl {

// dlopen()s `name` from $env_var when set, else from next to the binary or
// library that holds `anchor` (its directory, then ../lib), else through the
// loader's search path. nullptr when none loads; `errors` then lists why,
// one line per place tried. The handle stays open for the process's life.
void* open_plugin(const char* name, const char* env_var, const void* anchor, int dlopen_flags, std::string* errors);

}  // namespace wl

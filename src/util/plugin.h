// Private: where weightlift's optional libraries (libweightlift_cuda.so,
// libweightlift_mpi.so) are looked for at run time, so that one build serves
// machines with and without CUDA or MPI.
#pragma once

#include <string>
#include <vector>

namespace wl {

// The places to dlopen() `name` from, in order: $env_var when set, next to
// the binary or library that holds `anchor` (its directory, then ../lib),
// then the bare name (the loader's search path).
std::vector<std::string> plugin_candidates(const char* name, const char* env_var, const void* anchor);

// dlopen()s the first candidate that loads; nullptr when none does, `errors`
// then listing why, one line per place tried. The handle stays open.
void* open_plugin(const std::vector<std::string>& candidates, int dlopen_flags, std::string* errors);

}  // namespace wl

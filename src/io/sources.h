// Private: the URL sources the library registers with Env::Default() on first
// use. Each source component adds its registration here.
#pragma once

namespace wl {

// Called once, from Env::Default().
void register_builtin_url_schemes();

}  // namespace wl

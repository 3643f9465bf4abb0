#include "io/sources.h"

#include "weightlift/io.h"

namespace wl {

void register_builtin_url_schemes() {
  // Sources for http(s)://, s3:// and gs:// register here as they land.
}

}  // namespace wl

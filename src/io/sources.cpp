#include "io/sources.h"

#include "http/remote_file.h"
#include "weightlift/io.h"
#include "weightlift/s3.h"

namespace wl {

void register_builtin_url_schemes() {
  // Process-lifetime sources (never destroyed: files may outlive static destruction order).
  static Env* const http = remote::new_http_env().release();
  static Env* const s3 = new_s3_env("s3").release();
  static Env* const gs = new_s3_env("gs").release();
  register_url_scheme("http", http);
  register_url_scheme("https", http);
  register_url_scheme("s3", s3);
  register_url_scheme("gs", gs);
}

}  // namespace wl

// weightlift/sources.h: the sources behind Env::Default() (io.h).
//
// Env::Default() serves local paths and URLs alike: POSIX files for local
// paths (local_env()), and for a path of the form "scheme://..." the source
// registered for its scheme -- the library registers "http://" and
// "https://" (ranged GETs, http.h) and "s3://" and "gs://" (the S3 protocol,
// s3.h) on first use. A source that serves files while it makes them (the
// Hub's load while downloading, hub.h) overlays their folder. This layer
// (src/sources/) composes them; io/ below knows none of them.
// Thread-safe.
#pragma once

#include <string>

#include "weightlift/io.h"

namespace wl {

// Makes Env::Default() send paths of `scheme` ("s3", "gs", "http", "https")
// to `env` (not owned; must outlive every use). A later registration for the
// same scheme replaces the earlier one.
void register_url_scheme(std::string scheme, Env* env);

// Makes Env::Default() send every local path at or below the folder `prefix`
// (no trailing '/') to `env` (not owned) until remove_path_overlay(prefix):
// for sources that serve files while they are being made (the Hub's
// load-while-downloading). `env` forwards what it does not serve to
// local_env(). The newest overlay of a prefix wins.
void add_path_overlay(std::string prefix, Env* env);
void remove_path_overlay(const std::string& prefix, Env* env);

}  // namespace wl

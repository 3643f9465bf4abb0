// Private helpers shared by src/hub/*.cpp.
#pragma once

#include <string>

#include "weightlift/hub.h"

namespace wl {

Status check_repo_id(const std::string& repo_id);
Status check_revision(const std::string& rev);
bool is_commit_hash(const std::string& s);
bool is_safe_etag(const std::string& s);
Status make_dirs(const std::string& path);


}  // namespace wl

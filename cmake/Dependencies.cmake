# Every dependency comes from Debian's packages (installed by scripts/setup);
# nothing is vendored. See README "Dependencies" for why each one is here.
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)   # JSON parsing (headers, index files, Hub API)
find_package(fmt REQUIRED)                  # string formatting for messages and tables
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # SHA-256 (checksums, LFS ETags, lock names)
find_package(CURL REQUIRED)                 # HTTP client of the Hub downloader (libcurl4-openssl-dev)
find_package(PkgConfig REQUIRED)
pkg_check_modules(RE2 REQUIRED IMPORTED_TARGET re2)  # regular expressions (checkpoint-name remapping)
pkg_check_modules(TINYXML2 REQUIRED IMPORTED_TARGET tinyxml2)  # XML of S3 listings and errors (libtinyxml2-dev)
find_package(CLI11 CONFIG QUIET)            # command-line parsing (the CLI only)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

add_library(weightlift_deps INTERFACE)
target_link_libraries(weightlift_deps INTERFACE
  nlohmann_json::nlohmann_json fmt::fmt OpenSSL::Crypto CURL::libcurl PkgConfig::RE2 PkgConfig::TINYXML2 Threads::Threads
  ${CMAKE_DL_LIBS})

add_library(weightlift_cli_deps INTERFACE)
target_link_libraries(weightlift_cli_deps INTERFACE CLI11::CLI11)

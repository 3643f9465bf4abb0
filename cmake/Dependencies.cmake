# Every dependency comes from Debian's packages (installed by scripts/setup);
# nothing is vendored. See README "Dependencies" for why each one is here.
# Each is looked for quietly; what is missing is reported once, at the end, by
# the Debian packages that provide it (a source build, e.g. `pip install` of
# the sdist, then says what to install instead of failing on the first one).
set(WEIGHTLIFT_MISSING_PACKAGES "")
macro(weightlift_require found debian_package)
  if(NOT ${found})
    list(APPEND WEIGHTLIFT_MISSING_PACKAGES ${debian_package})
  endif()
endmacro()

find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 QUIET)      # JSON parsing (headers, index files, Hub API)
weightlift_require(nlohmann_json_FOUND nlohmann-json3-dev)
find_package(fmt QUIET)                     # string formatting for messages and tables
weightlift_require(fmt_FOUND libfmt-dev)
find_package(OpenSSL QUIET COMPONENTS Crypto)  # SHA-256 (checksums, LFS ETags, lock names)
weightlift_require(OpenSSL_FOUND libssl-dev)
find_package(CURL QUIET)                    # HTTP client of the Hub downloader
weightlift_require(CURL_FOUND libcurl4-openssl-dev)
find_package(PkgConfig QUIET)
weightlift_require(PKG_CONFIG_FOUND pkg-config)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(RE2 QUIET IMPORTED_TARGET re2)  # regular expressions (checkpoint-name remapping)
  weightlift_require(RE2_FOUND libre2-dev)
  pkg_check_modules(TINYXML2 QUIET IMPORTED_TARGET tinyxml2)  # XML of S3 listings and errors
  weightlift_require(TINYXML2_FOUND libtinyxml2-dev)
  pkg_check_modules(ISAL QUIET IMPORTED_TARGET libisal)  # CRC-32C / CRC-32 of GCS and S3 checksums (Intel ISA-L)
  weightlift_require(ISAL_FOUND libisal-dev)
else()
  list(APPEND WEIGHTLIFT_MISSING_PACKAGES libre2-dev libtinyxml2-dev libisal-dev)
endif()
find_package(CLI11 CONFIG QUIET)            # command-line parsing (the CLI only)
if(NOT CLI11_FOUND)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
  weightlift_require(CLI11_INCLUDE_DIR libcli11-dev)
endif()
if(WEIGHTLIFT_PYTHON)  # the extension: the Python headers (python/CMakeLists.txt)
  find_package(Python 3.9 QUIET COMPONENTS Interpreter Development.Module ${SKBUILD_SABI_COMPONENT})
  weightlift_require(Python_Development.Module_FOUND python3-dev)
endif()

if(WEIGHTLIFT_MISSING_PACKAGES)
  list(REMOVE_DUPLICATES WEIGHTLIFT_MISSING_PACKAGES)
  list(JOIN WEIGHTLIFT_MISSING_PACKAGES " " missing)
  message(FATAL_ERROR "weightlift: building from source needs system packages that are missing.\n"
    "  Debian/Ubuntu:  sudo apt-get install ${missing}\n"
    "(other systems: the same libraries' development packages; scripts/setup installs everything on "
    "Debian 12). A binary wheel needs none of them: pip install weightlift picks one where it exists.")
endif()

if(NOT CLI11_FOUND)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

add_library(weightlift_deps INTERFACE)
target_link_libraries(weightlift_deps INTERFACE
  nlohmann_json::nlohmann_json fmt::fmt OpenSSL::Crypto CURL::libcurl PkgConfig::RE2 PkgConfig::TINYXML2 PkgConfig::ISAL
  Threads::Threads
  ${CMAKE_DL_LIBS})

add_library(weightlift_cli_deps INTERFACE)
target_link_libraries(weightlift_cli_deps INTERFACE CLI11::CLI11)

// weightlift/s3.h: object storage over the S3 protocol (s3:// and gs://).
//
// Env::Default() serves "s3://bucket/key" and "gs://bucket/key" through the
// Env this header makes (registered for both schemes on first use), so every
// loader, strategy and destination reads an object as it reads a file:
//   open()       HeadObject: size() and version() (the ETag); then every
//                read_at() is a ranged GetObject written straight into the
//                caller's buffer, with If-Match on the ETag (an object replaced
//                mid-load fails with kAborted, never mixes versions)
//   list_dir()   ListObjectsV2 with delimiter "/" and continuation tokens
//   is_directory(), exists(), file_size()
// Requests are signed with AWS Signature Version 4 by libcurl
// (CURLOPT_AWS_SIGV4); no AWS SDK. gs:// goes to Google Cloud Storage's
// S3-compatible XML API with HMAC keys, or a bearer (OAuth) token.
//
// Configuration (resolve_s3_config; the first that is set wins):
//   endpoint  RUNAI_STREAMER_OVERRIDE_ENDPOINT_URL, AWS_ENDPOINT_URL_S3,
//             AWS_ENDPOINT_URL, endpoint_url of the profile in the config
//             file, else https://s3.<region>.amazonaws.com
//             (gs: WEIGHTLIFT_GS_ENDPOINT_URL, else https://storage.googleapis.com)
//   region    AWS_REGION, AWS_DEFAULT_REGION, region of the profile, else
//             us-east-1 (gs: "auto")
//   keys      AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN);
//             else the profile (AWS_PROFILE, else "default") in
//             AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then in
//             AWS_CONFIG_FILE (~/.aws/config, section "[profile NAME]")
//             (gs: GS_ACCESS_KEY_ID + GS_SECRET_ACCESS_KEY, HMAC keys; else a
//             bearer token from GOOGLE_OAUTH_ACCESS_TOKEN or
//             CLOUDSDK_AUTH_ACCESS_TOKEN)
//   anonymous AWS_NO_SIGN_REQUEST=1|true|yes: unsigned requests (public buckets)
//   address   path-style for a custom endpoint, virtual-hosted for AWS (bucket
//             names that are valid host names); RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING
//             =0|1 forces path-style or virtual-hosted
//   TLS       AWS_CA_BUNDLE: a certificate bundle file
// No credentials and no anonymous request is kPermissionDenied naming the
// variables to set. Secrets never appear in messages or logs.
//
// Thread-safety: every function here may be called from many threads; the
// Env from new_s3_env() is thread-safe and must outlive the files it opened
// only as long as it is registered (files keep their own client alive).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weightlift/http.h"
#include "weightlift/io.h"
#include "weightlift/status.h"

namespace wl {

// The URL schemes served as object storage ("s3", "gs"): the one list, which
// the URL parser, Env::Default()'s registration and the Python package take.
const std::vector<std::string>& object_storage_schemes();

// "s3://bucket/key/of/object" split up. key may be "" (the bucket itself) or
// end in "/" (a prefix).
struct S3Url {
  std::string scheme;  // "s3" or "gs"
  std::string bucket;
  std::string key;
};
// kInvalidArgument naming the URL for another scheme, an empty or malformed
// bucket name (1..222 characters of [a-z0-9._-], as S3 and GCS allow at most),
// or a key over 1024 bytes or holding control characters.
Result<S3Url> parse_s3_url(std::string_view url);

enum class S3Addressing { kAuto, kPath, kVirtual };

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials; sent as x-amz-security-token
};

struct S3Config {
  std::string scheme = "s3";  // "s3" or "gs"
  // "scheme://host[:port][/base]" without a trailing slash.
  std::string endpoint;
  std::string region = "us-east-1";
  S3Addressing addressing = S3Addressing::kAuto;
  std::optional<S3Credentials> credentials;  // HMAC keys for gs
  std::string bearer_token;                  // gs: OAuth access token (Authorization: Bearer)
  bool anonymous = false;                    // unsigned requests
  std::string ca_bundle;
  // Where the credentials came from, for messages ("environment (AWS_ACCESS_KEY_ID)",
  // "profile 'dev' in /home/u/.aws/credentials"); never the secret.
  std::string credentials_source;
};

// Reads one environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// The process environment (getenv).
EnvLookup process_environment();

// The configuration for `scheme` ("s3" or "gs") from the environment and the
// AWS shared files (read through `fs`, at most 1 MiB each), in the order
// above. A profile named by AWS_PROFILE that neither file has is kNotFound;
// an access key without its secret (or the reverse) is kInvalidArgument; no
// credentials and no anonymous request is kPermissionDenied.
Result<S3Config> resolve_s3_config(std::string_view scheme, const EnvLookup& env = process_environment(),
                                   Env* fs = Env::Default());

// The HTTP URL of an object (key non-empty) or of its bucket (key "") with
// the query parameters (sorted by name and percent-encoded here, as SigV4
// wants). Virtual-hosted addressing puts the bucket in the host name.
std::string s3_request_url(const S3Config& config, std::string_view bucket, std::string_view key,
                           std::vector<std::pair<std::string, std::string>> query = {});

// An Env serving URLs of config's scheme ("s3" or "gs"). With nullopt the
// configuration is resolved from the environment (resolve_s3_config) when a
// call needs it, and again whenever the relevant variables change; likewise
// the HTTP settings without `http` (HttpOptions(): the WEIGHTLIFT_*
// variables). Write-side methods are kUnimplemented. Register it with
// register_url_scheme() (sources.h) to replace the built-in source (e.g. with
// explicit credentials).
//
// Listings are untrusted: at most http.max_list_pages pages and
// http.max_list_entries entries (WEIGHTLIFT_LIST_MAX_PAGES / _ENTRIES), a
// continuation token seen before or 3 empty pages in a row that claim more
// (IsTruncated) are kCorruptData, and a key below the prefix that is not a
// plain relative path (an empty, "." or ".." component, a backslash, a
// control character) is kCorruptData naming the key.
std::unique_ptr<Env> new_s3_env(std::string scheme, std::optional<S3Config> config = std::nullopt,
                                std::optional<HttpOptions> http = std::nullopt);

// ---- copying a model out of object storage ----

// Files besides the weights that vLLM's object-storage loader pulls with a
// model (configs and tokenizers): "*.json", "*.model", "*.tiktoken", "*.txt", "*.py".
const std::vector<std::string>& model_config_patterns();

struct ModelDownloadOptions {
  bool configs = false;                      // also the files matching model_config_patterns()
  int threads = 16;                          // ranged reads in flight per file (1..256)
  uint64_t chunk_bytes = uint64_t{8} << 20;  // one read (64 KiB..1 GiB)
  Env* env = Env::Default();                 // both the source and the destination
  // Called after each chunk with (bytes done, bytes total) of the whole copy.
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ModelDownloadResult {
  std::vector<std::string> files;  // written, full local paths: weights (natural order) then configs
  uint64_t bytes = 0;
  // Files under the source that were not copied (not the chosen weights, the
  // index or, with configs, a config file), source-relative, sorted.
  std::vector<std::string> left_out;
  // Files written (full local paths) whose source vouched for no hash (plain
  // URLs, multipart objects, local folders), or all of them with
  // WEIGHTLIFT_VERIFY=0 (hash.h): written atomically, not verified.
  // Every other file matched its source's hash before taking its name.
  std::vector<std::string> unverified;
};

// Copies the weights of the model at `source` (chosen as find_weight_files()
// chooses them for a folder: safetensors first, de-duplicated with the index,
// natural order; plus the index itself) and, with options.configs, its config
// and tokenizer files -- at any depth below the source, into the matching
// sub-folders of `dir`, as vLLM's object-storage pull keeps them -- into the
// local folder `dir` (created). Every other file found below the source is
// named in left_out. A name that is not a plain relative path of safe
// characters (an empty, "." or ".." component, a backslash, a control
// character) is refused (kCorruptData naming it); so is a copy larger than the
// free space of `dir`'s disk (kOutOfRange), before anything is written. Each
// file is written through AtomicFile: a failure leaves no partial file under
// a final name. Works for any source Env::Default() serves (s3://, gs://, a
// local folder).
Result<ModelDownloadResult> download_model_files(const std::string& source, const std::string& dir,
                                                 const ModelDownloadOptions& options = {});

}  // namespace wl

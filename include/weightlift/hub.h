// weightlift/hub.h: downloading from the Hugging Face Hub into the very cache
// huggingface_hub uses (so transformers, vLLM and huggingface_hub find our
// files offline, and we find theirs), plus vLLM's weight-selection logic.
//
// Cache layout (byte for byte huggingface_hub 0.27's):
//   {cache}/models--{org}--{name}/blobs/{etag}            file contents
//   {cache}/models--{org}--{name}/snapshots/{commit}/{path} -> ../../blobs/{etag}  (relative symlink)
//   {cache}/models--{org}--{name}/refs/{revision}          commit sha of a branch/tag
//   {cache}/models--{org}--{name}/.no_exist/{commit}/{path} empty: the file is known missing
//   {cache}/.locks/models--{org}--{name}/{etag}.lock       flock, shared with huggingface_hub
// A blob is written as "{etag}.incomplete" (resumed with a Range request) or,
// for large files fetched by parallel ranged requests, "{etag}.wlparts" with a
// journal of finished chunks; it takes its final name only after its bytes
// match the ETag (SHA-256 for LFS files, git blob SHA-1 otherwise).
//
// Environment (read when a field below is left empty): HF_ENDPOINT, HF_HOME,
// HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
// HF_TOKEN_PATH, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, VLLM_USE_MODELSCOPE,
// MODELSCOPE_CACHE, MODELSCOPE_DOMAIN.
//
// Thread-safety: every function may be called from many threads and
// processes at once; concurrent downloads of one blob are serialised by its
// lock file. The token is sent only to the endpoint's host, and never logged.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/http.h"
#include "weightlift/lock.h"
#include "weightlift/status.h"

namespace wl {

struct HubOptions {
  std::string endpoint;              // "" = $HF_ENDPOINT or https://huggingface.co
  std::string cache_dir;             // "" = $HF_HUB_CACHE ... ~/.cache/huggingface/hub
  std::optional<std::string> token;  // nullopt = $HF_TOKEN or the token file; "" = no token
  std::optional<bool> offline;       // nullopt = $HF_HUB_OFFLINE; true: never touch the network
  std::string repo_type = "model";   // model, dataset or space
  int max_workers = 8;               // files downloaded at once
  int connections_per_file = 8;      // parallel ranged requests for one large file
  uint64_t chunk_bytes = 16ull << 20;         // size of one ranged request
  uint64_t parallel_min_bytes = 64ull << 20;  // files at least this large are split
  bool progress = false;             // a byte progress bar on stderr
  HttpOptions http;
  std::function<void(const std::string&)> log;  // info/warning lines (never contain the token)
};

// The effective settings after the environment is consulted.
std::string hub_endpoint(const HubOptions& o);
std::string hub_cache_dir(const HubOptions& o);
std::optional<std::string> hub_token(const HubOptions& o);  // nullopt: anonymous
bool hub_offline(const HubOptions& o);

// "models--org--name" (huggingface_hub's repo_folder_name).
std::string repo_folder_name(const std::string& repo_id, const std::string& repo_type = "model");
// Python's fnmatch.fnmatch on POSIX: '*' and '?' also match '/', [seq], [!seq].
bool fnmatch(const std::string& name, const std::string& pattern);
// huggingface_hub's filter_repo_objects: keep names matching any allow
// pattern (all when `allow` is empty) and no ignore pattern; a pattern ending
// in '/' matches everything below that folder.
std::vector<std::string> filter_repo_files(const std::vector<std::string>& files, const std::vector<std::string>& allow,
                                           const std::vector<std::string>& ignore);
// A repository file name is usable as a cache path: relative, no "." / ".."
// / empty components, no backslash or NUL. kInvalidArgument otherwise.
Status check_repo_path(const std::string& name);

struct RepoInfo {
  std::string sha;                 // commit of the revision
  std::vector<std::string> files;  // every file ("siblings")
};
Result<RepoInfo> repo_info(const std::string& repo_id, const std::string& revision, const HubOptions& o);

struct RepoEntry {
  std::string path;
  bool is_dir = false;
  uint64_t size = 0;
  std::string oid;         // git blob sha1
  std::string lfs_sha256;  // empty for non-LFS files
};
// /api/{type}s/{repo}/tree/{rev}/{path}, following every page (Link rel="next").
Result<std::vector<RepoEntry>> list_repo_tree(const std::string& repo_id, const std::string& revision,
                                              const std::string& path_in_repo, bool recursive, const HubOptions& o);

struct SnapshotOptions {
  std::string revision = "main";  // branch, tag or commit sha
  std::vector<std::string> allow_patterns;
  std::vector<std::string> ignore_patterns;
};
// huggingface_hub.snapshot_download into the cache; returns the snapshot
// folder {cache}/models--org--name/snapshots/{commit}. Offline (or when the
// Hub cannot be reached, or the repo is not found) the revision is resolved
// from refs/ and an existing snapshot folder is returned, else an error.
Result<std::string> snapshot_download(const std::string& repo_id, const SnapshotOptions& s, const HubOptions& o);

// huggingface_hub.hf_hub_download into the cache; returns the snapshot path
// of the file. `subfolder` is prefixed to `filename`.
Result<std::string> hf_hub_download(const std::string& repo_id, const std::string& filename,
                                    const std::string& revision = "main", const HubOptions& o = {},
                                    const std::string& subfolder = "");

// The download get_quant_config / get_sparse_attention_config (quant_config.h
// JsonDownloader) inject for remote models: snapshot_download of the files
// matching `pattern` at `revision` ("" = main) into `cache_dir` ("" = the
// Hub's default); `o` supplies everything else (offline, endpoint, log).
Result<std::string> download_config_files(const std::string& repo_id, const std::string& revision,
                                          const std::string& pattern, const std::string& cache_dir,
                                          HubOptions o = {});

// ---- vLLM's logic on top -----------------------------------------------------

// A cross-process, cross-user lock per model (vLLM's get_lock): flock on
// weightlift/lock.h get_lock() held for the object's lifetime (same file name and rules).
class ModelLock {
 public:
  static Result<ModelLock> acquire(const std::string& model_name_or_path, const std::string& cache_dir);
  ModelLock(ModelLock&&) noexcept = default;
  ModelLock& operator=(ModelLock&&) = delete;
  ~ModelLock();
  const std::string& path() const { return lock_->path(); }

 private:
  explicit ModelLock(std::unique_ptr<CrossProcessLock> lock) : lock_(std::move(lock)) {}
  std::unique_ptr<CrossProcessLock> lock_;  // weightlift/lock.h's get_lock()
};
std::string model_lock_path(const std::string& model_name_or_path, const std::string& cache_dir);

// vLLM's download_weights_from_hf: lists the repo once and keeps the first
// allow pattern that matches a file; with "*.safetensors" allowed and an
// index in the repo, downloads exactly the files its weight_map names.
// Holds the model lock while downloading. Returns the snapshot folder.
// With VLLM_USE_MODELSCOPE set, goes to ModelScope instead.
Result<std::string> download_weights_from_hf(const std::string& model, const std::vector<std::string>& allow_patterns,
                                             const std::string& revision = "main",
                                             const std::vector<std::string>& ignore_patterns = {},
                                             const HubOptions& o = {}, const std::string& subfolder = "");

// vLLM's download_safetensors_index_file_from_hf: a missing index (remote or
// offline) is fine and only logged.
Status download_safetensors_index_file_from_hf(const std::string& model, const std::string& index_file,
                                               const std::string& revision = "main", const HubOptions& o = {},
                                               const std::string& subfolder = "");

// For `weightlift ls/load`: an existing local path is returned as is;
// otherwise PATH_OR_REPO is a repository id whose weights (and index and
// JSON configs) are downloaded, or found offline, and its snapshot folder
// returned.
Result<std::string> resolve_model_path(const std::string& path_or_repo, const std::string& revision = "main",
                                       const HubOptions& o = {});

// ---- ModelScope ----------------------------------------------------------------
// modelscope's snapshot_download subset: GET
// {MODELSCOPE_DOMAIN}/api/v1/models/{owner}/{name}/repo/files?Revision=R&Recursive=True
// then each file from .../repo?Revision=R&FilePath=P, verified against its
// Sha256, into {cache}/models/{owner}/{name}/{path} ({cache} = o.cache_dir,
// else $MODELSCOPE_CACHE, else ~/.cache/modelscope/hub). Returns the folder.
Result<std::string> modelscope_snapshot_download(const std::string& model_id, const SnapshotOptions& s,
                                                 const HubOptions& o);
bool use_modelscope();  // VLLM_USE_MODELSCOPE is true

}  // namespace wl

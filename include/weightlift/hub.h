// weightlift/hub.h: downloading from the Hugging Face Hub into the very cache
// huggingface_hub uses (so transformers, vLLM and huggingface_hub find our
// files offline, and we find theirs), vLLM's weight-selection logic, and
// loading a repository's weights while they download.
//
// Cache layout (huggingface_hub 2.x's, which 0.x also reads):
//   {cache}/CACHEDIR.TAG                                   backup tools skip the cache
//   {cache}/models--{org}--{name}/blobs/{etag}             file contents
//   {cache}/models--{org}--{name}/snapshots/{commit}/{path} -> ../../blobs/{etag}  (relative symlink)
//   {cache}/models--{org}--{name}/refs/{revision}          commit sha of a branch/tag
//   {cache}/models--{org}--{name}/trees/{commit}.json      the commit's file listing (size, blob id, LFS sha256)
//   {cache}/models--{org}--{name}/.no_exist/{commit}/{path} empty: the file is known missing
//   {cache}/.locks/models--{org}--{name}/{etag}.lock       flock, shared with huggingface_hub
// A blob is written as "{etag}.{8 hex}.incomplete" (2.x's process-unique
// partial name) with "{partial}.ranges" journalling the byte ranges that
// arrived, so a dropped connection or a killed process resumes where it was;
// a partial file huggingface_hub left ("{etag}.incomplete" from 0.x, or a
// 2.x one without a journal) is resumed as the prefix it holds. A blob takes
// its final name only after its bytes match the ETag (SHA-256 for LFS files,
// git blob SHA-1 otherwise). Its claimed size (X-Linked-Size, Content-Length)
// is admitted against the cache's free disk before anything is sized by it,
// and the partial file takes that size only once the host holding the bytes
// confirms it (a mismatch is kCorruptData naming the file). Offline, a
// snapshot whose tree listing names selected files that are missing is
// refused as incomplete (as 2.x refuses it). Every request follows http.h's
// network policy (HubOptions::http: timeouts, retries, listing caps).
//
// Environment (read when a field below is left empty): HF_ENDPOINT, HF_HOME,
// HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_TOKEN, HUGGING_FACE_HUB_TOKEN,
// HF_TOKEN_PATH, HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, VLLM_USE_MODELSCOPE,
// MODELSCOPE_CACHE, MODELSCOPE_DOMAIN.
//
// Thread-safety: every function may be called from many threads and
// processes at once; concurrent downloads of one blob are serialised by its
// lock file. The token is sent only to the endpoint's host, and never logged.
//
// Text from the Hub (file names, ETags, URLs, error messages) reaches
// messages and logs only through inert() (text.h); a listed file name holding
// a control character is refused before anything is written (check_repo_path);
// a token holding one is refused naming where it came from, never sent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weightlift/http.h"
#include "weightlift/io.h"
#include "weightlift/lock.h"
#include "weightlift/status.h"

namespace wl {

struct HubOptions {
  std::string endpoint;                       // "" = $HF_ENDPOINT or https://huggingface.co
  std::string cache_dir;                      // "" = $HF_HUB_CACHE ... ~/.cache/huggingface/hub
  std::optional<std::string> token;           // nullopt = $HF_TOKEN or the token file; "" = no token
  std::optional<bool> offline;                // nullopt = $HF_HUB_OFFLINE; true: never touch the network
  std::string repo_type = "model";            // model, dataset or space
  int max_workers = 8;                        // files downloaded at once
  int connections_per_file = 8;               // parallel ranged requests for one large file
  uint64_t chunk_bytes = 16ull << 20;         // size of one ranged request
  uint64_t parallel_min_bytes = 64ull << 20;  // files at least this large are split
  bool progress = false;                      // a byte progress bar on stderr
  HttpOptions http;
  std::function<void(const std::string&)> log;  // info/warning lines (never contain the token)
  Env* env = nullptr;                           // every cache read and write goes through it; nullptr = Env::Default()
};

// The effective settings after the environment is consulted.
std::string hub_endpoint(const HubOptions& o);
std::string hub_cache_dir(const HubOptions& o);
// The token (nullopt: anonymous): HubOptions::token, else $HF_TOKEN, else
// $HUGGING_FACE_HUB_TOKEN, else the token file ($HF_TOKEN_PATH or
// $HF_HOME/token), trimmed of surrounding whitespace. kInvalidArgument naming
// that source (never the value) when it holds a control character (a token
// file of two lines, a CR/LF in the variable) or bytes that are not UTF-8.
Result<std::optional<std::string>> hub_token(const HubOptions& o);
bool hub_offline(const HubOptions& o);

// "models--org--name" (huggingface_hub's repo_folder_name).
std::string repo_folder_name(const std::string& repo_id, const std::string& repo_type = "model");
// huggingface_hub's filter_repo_objects: keep names matching any allow
// pattern (all when `allow` is empty) and no ignore pattern (glob_match,
// glob.h: Python's fnmatch); a pattern ending in '/' matches everything below
// that folder.
std::vector<std::string> filter_repo_files(const std::vector<std::string>& files, const std::vector<std::string>& allow,
                                           const std::vector<std::string>& ignore);
// A repository file name is usable as a cache path: relative, no "." / ".."
// / empty components, no backslash, no control character (C0, DEL, C1, the
// Unicode format controls: text.h's has_control_chars) and valid UTF-8.
// kInvalidArgument otherwise, naming it inertly.
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
// folder {cache}/models--org--name/snapshots/{commit}. The file list is the
// commit's recursive tree listing (every Link page), kept as
// trees/{commit}.json; patterns that match nothing log huggingface_hub's
// warning ("No files matched ..."). Offline (or when the Hub cannot be
// reached, or the repo is not found) the revision is resolved from refs/ and
// the existing snapshot folder is returned -- unless its tree listing shows
// selected files missing (kNotFound "... is incomplete: N file(s) are
// missing ...") -- else an error. A revision the Hub does not know is
// kNotFound naming the repository and the revision.
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
                                          const std::string& pattern, const std::string& cache_dir, HubOptions o = {});

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

// ---- Loading while downloading ------------------------------------------------
// A repository's weights served while they download, in one pass: parallel
// ranged GETs write each blob into the cache and, in the same pass, fill the
// load's buffers.
//
// start() resolves the repository as resolve_model_path() does (the weight
// files download_weights_from_hf picks, the safetensors index, the JSON
// configs), downloads the small files, takes the lock of every weight blob
// still missing from the cache and starts background requests over them in
// load order -- as many as a plain download keeps open (connections_per_file
// x min(max_workers, files)), in chunks of size / (4 x connections_per_file)
// between 1 MiB and chunk_bytes. While the
// object lives, Env::Default() serves the snapshot folder through it (a path
// overlay, io.h): a weight file's snapshot path opens as a RandomAccessFile
// whose read_at() copies the bytes that arrived, waits for a range another
// request is fetching, and fetches a missing range itself -- into the
// caller's buffer and into the blob's partial file at once. Each blob is
// hash-verified as its chunks arrive, renamed into place and linked exactly
// as a plain download leaves it; Env::wait_complete() on its path (which
// load_files calls before it returns) blocks until then and returns a
// mismatch as kCorruptData naming the repository, the file and the revision.
// A dropped connection resumes without re-reading what arrived; a killed
// process leaves journalled partial files that the next download resumes.
// Offline, or with every weight already cached, nothing is pending and the
// folder is served as is. Thread-safe. The destructor stops the background
// requests (partial files stay, for a resume) and removes the overlay.
class HubSource {
 public:
  static Result<std::unique_ptr<HubSource>> start(const std::string& repo_id, const std::string& revision = "main",
                                                  const HubOptions& o = {});
  ~HubSource();
  HubSource(const HubSource&) = delete;
  HubSource& operator=(const HubSource&) = delete;

  const std::string& folder() const;  // snapshots/{commit}
  // The weight files (snapshot paths, natural order) as find_weight_files() gives them.
  const std::vector<std::string>& weight_files() const;
  // Snapshot paths of the files that were still to download at start().
  std::vector<std::string> pending() const;
  // Blocks until every pending blob is verified and linked; the first failure.
  Status finish();
  // The overlay Env (Env::Default() already routes the folder to it).
  Env* env();

  struct Impl;

 private:
  explicit HubSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- ModelScope ----------------------------------------------------------------
// modelscope's snapshot_download subset: GET
// {MODELSCOPE_DOMAIN}/api/v1/models/{owner}/{name}/repo/files?Revision=R&Recursive=True
// then each file from .../repo?Revision=R&FilePath=P, verified against its
// Sha256, into the layout modelscope (>= 1.38, modelscope-hub) reads offline:
// {cache}/models/{owner}--{name}/snapshots/{revision}/{path} ({cache} =
// o.cache_dir, else $MODELSCOPE_CACHE, else ~/.cache/modelscope). A folder
// of modelscope's older layout ({cache}[/hub]/models/{owner}/{name with '.'
// as '___'}) that already holds files is reused, as modelscope reuses it.
// Offline: that folder when it has entries, else kNotFound. Returns the folder.
Result<std::string> modelscope_snapshot_download(const std::string& model_id, const SnapshotOptions& s,
                                                 const HubOptions& o);
bool use_modelscope();  // VLLM_USE_MODELSCOPE is true

}  // namespace wl

// weightlift/loader.h: the loading engine. Every tensor of a checkpoint (or
// this rank's part of it) is materialized into memory the caller then owns
// and handed to `sink` as soon as it is complete.
//
// Strategies (all give identical bytes; see docs/engine.md):
//   lazy      mmap each file, copy each tensor out of the mapping (safe_open)
//   eager     read each file whole with one read, tensors view that buffer
//   prefetch  warm the page cache in the background (threads, block size,
//             files striped by rank), then lazy
//   auto      stream for URLs (http(s), s3, gs: remote sources); prefetch on
//             a network filesystem when the checkpoint fits in 90% of
//             available RAM, else lazy; the reason goes to `log`
//   threads   N workers each loading whole files; at most N files in memory
//   stream    all files as one byte stream split across N I/O threads in large
//             aligned chunks (O_DIRECT when the page cache is cold), each tensor
//             handed over when its last byte lands, under a memory cap; on
//             a remote source each chunk is ranged GETs straight into the
//             tensors' memory (16 connections by default)
//
// The three seams (see their headers): where bytes come from (Env: local
// files, HTTP, object storage), where they land (Destination: host, pinned,
// CUDA, the caller's memory) and who reads which bytes (Collective: ranks that
// read the checkpoint once in total and exchange the rest).
//
// Ownership: a LoadedTensor's view owns (shares) its bytes, except when the
// caller's destination supplied them (then the caller owns them and the
// view's owner is null). No view ever points into a buffer the loader reuses.
// Consistency: each file's header and data come from the same version of the
// file; a file replaced during the load fails it with kAborted naming the file.
// Threading: load_files() blocks; `sink` and `progress` are called from one
// thread at a time (possibly different threads), in no promised order across
// files (file order for lazy/eager/prefetch/auto).
// Non-safetensors files (.bin/.pt/.npy) go through CheckpointReader.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "weightlift/load_options.h"
#include "weightlift/load_plan.h"
#include "weightlift/status.h"

namespace wl {

// Loads the tensors of the given weight files (any CheckpointReader format;
// paths or URLs, through options.env): plan_load() then execute()
// (load_plan.h); `planned`, when given, sees the plan before it is carried
// out (the Python stream hands it back). Before it returns OK it calls
// options.env->wait_complete(file) for every file, so a source still writing
// a file (the Hub's load-while-downloading) can fail the load after the fact
// (a blob whose hash does not match), even when its tensors were handed over.
Result<LoadStats> load_files(const std::vector<std::string>& files, const LoadOptions& options,
                             const std::function<Status(LoadedTensor&&)>& sink,
                             const std::function<void(const LoadPlan&)>& planned = nullptr);

}  // namespace wl

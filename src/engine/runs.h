// engine/runs.h: work cut into runs of consecutive items, each run taken
// whole by one thread and done front to back. Threads paging in
// neighbouring blocks of one file contend for the same pages (the kernel's
// read-around of one thread's fault spans the neighbour's block) and spend
// several times the CPU; runs taken in order keep the front of the work
// first and each thread's reads sequential. Used by the read-ahead job and
// by populate_read (read_ahead.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace wl::engine {

// [first, second) runs over items [0, n): the groups [0, group_ends[0]),
// [group_ends[0], group_ends[1]), ... (ascending; n is the last) each cut
// every `k` items (k >= 1), never across a group's end. Empty groups give
// no run.
std::vector<std::pair<size_t, size_t>> cut_runs(std::span<const size_t> group_ends, size_t k);

// Calls fn(worker, item) for every item of `runs` on up to `threads`
// threads (the calling thread is worker 0; workers are numbered [0, threads)
// so that the caller can keep per-thread state): each thread takes the next
// run in order and does its items front to back. Once fn returns false no
// further item is started by any thread (the running ones finish). Returns
// when every thread is done. fn must be thread-safe across workers.
void run_in_order(std::span<const std::pair<size_t, size_t>> runs, int threads,
                  const std::function<bool(size_t worker, size_t item)>& fn);

}  // namespace wl::engine

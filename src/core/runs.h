// core/runs.h: work cut into runs of consecutive items, each run taken
// whole by one thread and done front to back. Threads paging in
// neighbouring blocks of one file contend for the same pages (the kernel's
// read-around of one thread's fault spans the neighbour's block) and spend
// several times the CPU; runs taken in order keep the front of the work
// first and each thread's reads sequential. Used by the read-ahead job and
// by populate_read (engine/read_ahead.cpp); run_each (every item a run of
// its own) by the thread pools that hand out files or pieces one at a time:
// the threads strategy, the prefetcher, the distributed scatter and the
// Hub download's phases.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "weightlift/status.h"

namespace wl {

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
// when every thread is done. fn must be thread-safe across workers. An
// exception thrown by fn stops the work as false does and is rethrown here
// once every thread has joined (the first one; nothing leaves a thread).
void run_in_order(std::span<const std::pair<size_t, size_t>> runs, int threads,
                  const std::function<bool(size_t worker, size_t item)>& fn);

// run_in_order with every item of [0, n) a run of its own: the threads take
// the items one at a time, in order. Same contract otherwise.
void run_each(size_t n, int threads, const std::function<bool(size_t worker, size_t item)>& fn);

// run_in_order for work that fails with a Status: the first failure stops
// the rest and is returned (OK when every item succeeded). An exception
// thrown by fn is that item's failure: kOutOfRange "out of memory: ..." for
// std::bad_alloc, kInternal for any other std::exception.
Status run_in_order_until_error(std::span<const std::pair<size_t, size_t>> runs, int threads,
                                const std::function<Status(size_t worker, size_t item)>& fn);

// run_in_order_until_error with every item of [0, n) a run of its own.
Status run_each_until_error(size_t n, int threads, const std::function<Status(size_t worker, size_t item)>& fn);

}  // namespace wl

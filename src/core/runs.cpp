#include "core/runs.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>

namespace wl {

std::vector<std::pair<size_t, size_t>> cut_runs(std::span<const size_t> group_ends, size_t k) {
  k = std::max<size_t>(k, 1);
  std::vector<std::pair<size_t, size_t>> runs;
  size_t begin = 0;
  for (size_t end : group_ends) {
    for (size_t b = begin; b < end; b += k) runs.push_back({b, std::min(end, b + k)});
    begin = std::max(begin, end);
  }
  return runs;
}

void run_in_order(std::span<const std::pair<size_t, size_t>> runs, int threads,
                  const std::function<bool(size_t, size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stopped{false};
  std::mutex mu;
  std::exception_ptr thrown;
  auto worker = [&](size_t w) {
    try {
      for (size_t r; !stopped.load() && (r = next.fetch_add(1)) < runs.size();) {
        for (size_t item = runs[r].first; item < runs[r].second; ++item) {
          if (stopped.load()) return;
          if (!fn(w, item)) {
            stopped.store(true);
            return;
          }
        }
      }
    } catch (...) {
      stopped.store(true);
      std::lock_guard lk(mu);
      if (!thrown) thrown = std::current_exception();
    }
  };
  const size_t n = std::clamp<size_t>(static_cast<size_t>(std::max(threads, 1)), 1, std::max<size_t>(runs.size(), 1));
  std::vector<std::thread> ts;
  ts.reserve(n - 1);
  for (size_t w = 1; w < n; ++w) ts.emplace_back(worker, w);
  worker(0);
  for (auto& t : ts) t.join();
  if (thrown) std::rethrow_exception(thrown);
}

void run_each(size_t n, int threads, const std::function<bool(size_t, size_t)>& fn) {
  const size_t ends[] = {n};
  run_in_order(cut_runs(ends, 1), threads, fn);
}

Status run_in_order_until_error(std::span<const std::pair<size_t, size_t>> runs, int threads,
                                const std::function<Status(size_t, size_t)>& fn) {
  std::mutex mu;
  Status first;
  run_in_order(runs, threads, [&](size_t w, size_t item) {
    Status st;
    try {
      st = fn(w, item);
    } catch (const std::bad_alloc& e) {
      st = Status::OutOfRange(std::string("out of memory: ") + e.what());
    } catch (const std::exception& e) {
      st = Status::Internal(std::string("unexpected exception: ") + e.what());
    }
    if (st.ok()) return true;
    std::lock_guard lk(mu);
    if (first.ok()) first = std::move(st);
    return false;
  });
  return first;
}

Status run_each_until_error(size_t n, int threads, const std::function<Status(size_t, size_t)>& fn) {
  const size_t ends[] = {n};
  return run_in_order_until_error(cut_runs(ends, 1), threads, fn);
}

}  // namespace wl

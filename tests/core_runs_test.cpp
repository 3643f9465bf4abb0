// core/runs.h: work cut into runs of consecutive items, each run done
// front to back by one thread (the read-ahead's blocks, populate_read's
// chunks), and run_each, every item a run of its own (the thread pools'
// files and pieces).
#include "core/runs.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace wl {
namespace {

using Runs = std::vector<std::pair<size_t, size_t>>;

TEST(Runs, CutEveryKNeverAcrossAGroupsEnd) {
  const std::vector<size_t> ends = {5, 5, 6, 14};
  EXPECT_EQ(cut_runs(ends, 4), (Runs{{0, 4}, {4, 5}, {5, 6}, {6, 10}, {10, 14}}));
  EXPECT_EQ(cut_runs(ends, 1).size(), 14u);
  EXPECT_EQ(cut_runs(ends, 0).size(), 14u);  // k 0 taken as 1
  EXPECT_EQ(cut_runs(ends, 100), (Runs{{0, 5}, {5, 6}, {6, 14}}));
  EXPECT_TRUE(cut_runs({}, 4).empty());
}

struct Done {
  size_t worker, item;
  std::thread::id thread;
};

TEST(Runs, EachRunIsDoneFrontToBackByOneThread) {
  const Runs runs = cut_runs(std::vector<size_t>{16, 18}, 4);  // [0,4) [4,8) [8,12) [12,16) [16,18)
  std::mutex mu;
  std::vector<Done> done;
  std::set<size_t> workers;
  run_in_order(runs, 3, [&](size_t w, size_t item) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // every thread gets to take work
    std::lock_guard lk(mu);
    done.push_back({w, item, std::this_thread::get_id()});
    workers.insert(w);
    return true;
  });
  ASSERT_EQ(done.size(), 18u);
  EXPECT_GT(workers.size(), 1u);
  for (size_t w : workers) EXPECT_LT(w, 3u);
  for (auto [begin, end] : runs) {
    std::vector<size_t> seen;
    const Done* first = nullptr;
    for (const Done& d : done) {
      if (d.item < begin || d.item >= end) continue;
      if (!first) first = &d;
      EXPECT_EQ(d.thread, first->thread) << "item " << d.item << " done by another thread";
      EXPECT_EQ(d.worker, first->worker);
      seen.push_back(d.item);
    }
    std::vector<size_t> want;
    for (size_t i = begin; i < end; ++i) want.push_back(i);
    EXPECT_EQ(seen, want);
  }
  // The calling thread is worker 0 and takes runs too.
  bool caller = false;
  for (const Done& d : done) caller |= d.thread == std::this_thread::get_id() && d.worker == 0;
  EXPECT_TRUE(caller);
}

TEST(Runs, NoItemStartsOnceOneReturnsFalse) {
  const Runs runs = cut_runs(std::vector<size_t>{40}, 4);
  std::vector<size_t> seen;
  run_in_order(runs, 1, [&](size_t, size_t item) {
    seen.push_back(item);
    return item != 5;
  });
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));

  std::atomic<size_t> calls{0}, after{0};
  std::atomic<bool> failed{false};
  run_in_order(runs, 4, [&](size_t, size_t item) {
    if (failed.load()) ++after;
    ++calls;
    if (item == 2) {
      failed.store(true);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return true;
  });
  EXPECT_LT(calls.load(), 40u);
  // Threads busy when it failed may finish the item they started, never begin two more.
  EXPECT_LE(after.load(), 3u);
}

TEST(Runs, NoRunsNoCallsAndMoreThreadsThanRuns) {
  int calls = 0;
  run_in_order({}, 8, [&](size_t, size_t) { return ++calls > 0; });
  EXPECT_EQ(calls, 0);
  std::atomic<int> n{0};
  std::set<size_t> workers;
  std::mutex mu;
  run_in_order(cut_runs(std::vector<size_t>{3}, 4), 8, [&](size_t w, size_t) {
    std::lock_guard lk(mu);
    workers.insert(w);
    return ++n > 0;
  });
  EXPECT_EQ(n.load(), 3);
  EXPECT_EQ(workers, std::set<size_t>{0});  // one run: one thread
}

TEST(Runs, EachItemOnceInOrderAndStopsWhenOneFails) {
  std::vector<size_t> seen;
  run_each(6, 1, [&](size_t w, size_t item) {
    EXPECT_EQ(w, 0u);
    seen.push_back(item);
    return true;
  });
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
  seen.clear();
  run_each(40, 1, [&](size_t, size_t item) {
    seen.push_back(item);
    return item != 3;
  });
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3}));

  std::mutex mu;
  std::vector<int> count(200, 0);
  std::set<size_t> workers;
  run_each(200, 4, [&](size_t w, size_t item) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard lk(mu);
    ++count[item];
    workers.insert(w);
    return true;
  });
  for (size_t i = 0; i < count.size(); ++i) EXPECT_EQ(count[i], 1) << "item " << i;
  EXPECT_GT(workers.size(), 1u);
  EXPECT_LT(*workers.rbegin(), 4u);
  int calls = 0;
  run_each(0, 4, [&](size_t, size_t) { return ++calls > 0; });
  EXPECT_EQ(calls, 0);
}

TEST(Runs, AnExceptionStopsTheWorkAndReachesTheCaller) {
  std::atomic<size_t> after{0};
  std::atomic<bool> thrown{false};
  EXPECT_THROW(run_each(100, 3,
                        [&](size_t, size_t item) {
                          if (thrown.load()) ++after;
                          if (item == 4) {
                            thrown.store(true);
                            throw std::runtime_error("item 4");
                          }
                          std::this_thread::sleep_for(std::chrono::microseconds(200));
                          return true;
                        }),
               std::runtime_error);
  EXPECT_LE(after.load(), 2u);  // the other threads finish what they started, nothing more
}

TEST(Runs, UntilErrorReturnsTheFirstFailureAndTurnsExceptionsIntoOne) {
  std::atomic<size_t> calls{0};
  EXPECT_TRUE(run_each_until_error(30, 4, [&](size_t, size_t) {
                ++calls;
                return Status();
              }).ok());
  EXPECT_EQ(calls.load(), 30u);
  std::vector<size_t> seen;
  Status st = run_each_until_error(30, 1, [&](size_t, size_t item) {
    seen.push_back(item);
    return item == 2 ? Status::IoError("piece 2") : Status();
  });
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_EQ(st.message(), "piece 2");
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2}));
  st = run_each_until_error(8, 2, [&](size_t, size_t item) -> Status {
    if (item == 1) throw std::bad_alloc();
    return Status();
  });
  EXPECT_EQ(st.code(), Code::kOutOfRange);
  EXPECT_NE(st.message().find("out of memory"), std::string::npos) << st.message();
  st = run_each_until_error(8, 2, [&](size_t, size_t item) -> Status {
    if (item == 0) throw std::logic_error("bad state");
    return Status();
  });
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("bad state"), std::string::npos) << st.message();
}

// The form populate_read uses: runs, each front to back, the first failure
// returned and no run started after it.
TEST(Runs, InOrderUntilErrorStopsWithinTheFailingRun) {
  const size_t ends[] = {6};
  std::vector<size_t> seen;
  Status st = run_in_order_until_error(cut_runs(ends, 3), 1, [&](size_t, size_t item) {
    seen.push_back(item);
    return item == 1 ? Status::IoError("chunk 1") : Status();
  });
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_EQ(st.message(), "chunk 1");
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1}));
  std::atomic<size_t> calls{0};
  EXPECT_TRUE(run_in_order_until_error(cut_runs(ends, 2), 3, [&](size_t, size_t) {
                ++calls;
                return Status();
              }).ok());
  EXPECT_EQ(calls.load(), 6u);
}

}  // namespace
}  // namespace wl

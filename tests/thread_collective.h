// A Collective for tests only: W threads of one process are the ranks and
// exchange through shared memory, with the real implementations' failure
// behaviour (abort() fails the others' pending and later calls; a rank that
// stops answering makes the others time out).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "weightlift/collective.h"

namespace wl::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world, std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : world_(world), timeout_(timeout), ptrs_(static_cast<size_t>(world)), strs_(static_cast<size_t>(world)) {}

  std::unique_ptr<Collective> member(int rank);
  int calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }

 private:
  friend class ThreadMember;
  // Every rank contributes, then consumes the others' contributions while
  // they wait, then all leave together.
  template <class Contribute, class Consume>
  Status call(int rank, Contribute contribute, Consume consume) {
    std::unique_lock lk(mu_);
    if (aborted_) return Status::Aborted(why_);
    contribute();
    const uint64_t g1 = gen1_;
    if (++arrived_ == world_) {
      ++gen1_;
      ++calls_;
      cv_.notify_all();
    } else if (!wait(
                   lk, [&] { return gen1_ != g1; }, rank)) {
      return Status::Aborted(why_);
    }
    lk.unlock();
    consume();
    lk.lock();
    const uint64_t g2 = gen2_;
    if (++departed_ == world_) {
      arrived_ = departed_ = 0;
      ++gen2_;
      cv_.notify_all();
    } else if (!wait(
                   lk, [&] { return gen2_ != g2; }, rank)) {
      return Status::Aborted(why_);
    }
    return Status();
  }
  template <class Pred>
  bool wait(std::unique_lock<std::mutex>& lk, Pred done, int rank) {
    bool ok = cv_.wait_for(lk, timeout_, [&] { return done() || aborted_; });
    if (aborted_) return false;
    if (!ok) {
      aborted_ = true;
      why_ = fmt::format("rank {}: the other ranks did not answer within {} ms", rank, timeout_.count());
      cv_.notify_all();
      return false;
    }
    return true;
  }
  void abort(const std::string& why) {
    std::lock_guard lk(mu_);
    if (!aborted_) why_ = why;
    aborted_ = true;
    cv_.notify_all();
  }

  const int world_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0, departed_ = 0, calls_ = 0;
  uint64_t gen1_ = 0, gen2_ = 0;
  bool aborted_ = false;
  std::string why_;
  std::vector<std::byte*> ptrs_;
  std::vector<std::string> strs_;
};

class ThreadMember final : public Collective {
 public:
  ThreadMember(ThreadGroup* g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_->world_; }
  Device device() const override { return kCpu; }
  Status all_gather(std::byte* buf, uint64_t block) override {
    return g_->call(
        rank_, [&] { g_->ptrs_[static_cast<size_t>(rank_)] = buf; },
        [&] {
          for (int k = 0; k < g_->world_; ++k)
            if (k != rank_) std::memcpy(buf + k * block, g_->ptrs_[static_cast<size_t>(k)] + k * block, block);
        });
  }
  Status broadcast(std::byte* buf, uint64_t n, int root) override {
    return g_->call(
        rank_, [&] { g_->ptrs_[static_cast<size_t>(rank_)] = buf; },
        [&] {
          if (rank_ != root) std::memcpy(buf, g_->ptrs_[static_cast<size_t>(root)], n);
        });
  }
  Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    std::vector<std::string> out;
    Status s = g_->call(
        rank_, [&] { g_->strs_[static_cast<size_t>(rank_)] = mine; }, [&] { out = g_->strs_; });
    if (!s.ok()) return s;
    return out;
  }
  void abort(const Status& why) override { g_->abort(fmt::format("rank {} aborted: {}", rank_, why.to_string())); }

 private:
  ThreadGroup* g_;
  int rank_;
};

inline std::unique_ptr<Collective> ThreadGroup::member(int rank) { return std::make_unique<ThreadMember>(this, rank); }

}  // namespace wl::testing

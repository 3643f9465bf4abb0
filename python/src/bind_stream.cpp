// The background load behind every iterator of the package (weightlift._core.Stream):
// the load is planned (plan_load) and carried out (execute) on an engine
// thread, which hands each finished tensor to a bounded queue; __next__ pops
// it (GIL released while waiting). The plan's log comes back with it (log(),
// describe()), so Python prints the engine's own reasons, never a
// prediction of them. Closing or dropping the stream cancels the load and
// joins the thread.
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "py_load_options.h"
#include "weightlift/load_plan.h"

namespace wlpy {

using namespace nb::literals;

namespace {

class Stream {
 public:
  // ordered: hand tensors over in checkpoint order (LoadOptions::ordered)
  // even when the engine finishes them out of order (stream, threads).
  Stream(std::vector<std::string> files, const PyLoadOptions& options, uint64_t max_queued_bytes,
         std::optional<std::vector<std::string>> only, std::optional<std::vector<std::string>> exclude, bool ordered)
      : max_bytes_(std::max<uint64_t>(max_queued_bytes, 1)), collective_(options.collective),
        read_ahead_(options.read_ahead) {
    dest_ = options.resolve(opts_);
    opts_.ordered = ordered;
    set_selection(opts_, only, true);
    set_selection(opts_, exclude, false);
    opts_.progress = [this](const wl::LoadProgress& p) {
      std::lock_guard lk(mu_);
      progress_ = p;
      return !stop_;
    };
    opts_.log = [this](const std::string& line) {
      std::lock_guard lk(mu_);
      log_.push_back(wl::inert(line));  // lines name files and URLs
    };
    worker_ = std::thread([this, files = std::move(files)] { run(files); });
  }
  ~Stream() { close(); }

  void close() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
      can_push_.notify_all();
    }
    if (worker_.joinable()) {
      nb::gil_scoped_release nogil;
      worker_.join();
    }
  }

  // (name, file, dtype, shape, bytes); raises StopIteration at the end.
  nb::tuple next() {
    std::optional<wl::LoadedTensor> t;
    {
      nb::gil_scoped_release nogil;
      std::unique_lock lk(mu_);
      can_pop_.wait(lk, [&] { return !queue_.empty() || done_; });
      if (!queue_.empty()) {
        t = std::move(queue_.front());
        queue_.pop_front();
        queued_ -= t->view.nbytes();
        can_push_.notify_all();
      }
    }
    if (!t) {
      std::unique_lock lk(mu_);
      if (!status_.ok() && !(stop_ && status_.code() == wl::Code::kCancelled)) {
        wl::Status s = std::move(status_);
        status_ = wl::Status();
        lk.unlock();
        raise(std::move(s));
      }
      throw nb::stop_iteration();
    }
    return nb::make_tuple(t->name, t->file, std::string(wl::dtype_name(t->view.dtype())), nb::cast(t->view.shape()),
                          bytes_array(t->view.bytes(), t->view.owner(), t->view.device()));
  }

  // The figures so far (the engine's statistics once the load is done) and
  // "log": every line the engine logged (the plan's reasons first).
  nb::dict progress() {
    std::lock_guard lk(mu_);
    nb::dict d = stats_dict(stats_);
    d["bytes_done"] = progress_.bytes_done;
    d["bytes_total"] = progress_.bytes_total;
    d["tensors_done"] = progress_.tensors_done;
    d["tensors_total"] = progress_.tensors_total;
    d["files_done"] = progress_.files_done;
    d["files_total"] = progress_.files_total;
    d["log"] = log_;
    d["warnings"] = warnings_;
    return d;
  }
  // The lines the engine logged so far: the plan's reasons, then what the
  // load said as it ran (prefetch progress, fallbacks).
  std::vector<std::string> log() {
    std::lock_guard lk(mu_);
    return log_;
  }
  // The plan that runs, in words (LoadPlan::describe()); "" until planned.
  std::string describe() {
    std::lock_guard lk(mu_);
    return plan_text_;
  }

 private:
  void run(const std::vector<std::string>& files) {
    auto r = wl::load_files(
        files, opts_, [this](wl::LoadedTensor&& t) { return push(std::move(t)); },
        [this](const wl::LoadPlan& plan) {
          std::lock_guard lk(mu_);
          plan_text_ = inert_lines(plan.describe());
          if (plan.path().warn && plan.path().prefetch) warnings_.push_back(wl::inert(plan.path().prefetch->reason));
        });
    std::lock_guard lk(mu_);
    if (!r.ok())
      status_ = std::move(r).status();
    else
      stats_ = *r;
    done_ = true;
    can_pop_.notify_all();
  }

  wl::Status push(wl::LoadedTensor&& t) {
    std::unique_lock lk(mu_);
    // Always admit one tensor, however large, so the queue cannot deadlock.
    can_push_.wait(lk, [&] { return stop_ || queue_.empty() || queued_ + t.view.nbytes() <= max_bytes_; });
    if (stop_) return wl::Status::Cancelled("stream closed");
    queued_ += t.view.nbytes();
    queue_.push_back(std::move(t));
    can_pop_.notify_one();
    return wl::Status();
  }

  wl::LoadOptions opts_;
  uint64_t max_bytes_;
  std::shared_ptr<void> dest_;  // opts_.destination's owner (device loads)
  nb::object collective_;       // keeps opts_.collective alive
  nb::object read_ahead_;       // keeps opts_.env alive when it is a read-ahead's
  std::mutex mu_;
  std::condition_variable can_push_, can_pop_;
  std::deque<wl::LoadedTensor> queue_;
  uint64_t queued_ = 0;
  bool stop_ = false, done_ = false;
  wl::Status status_;
  wl::LoadStats stats_;
  wl::LoadProgress progress_;
  std::vector<std::string> log_, warnings_;
  std::string plan_text_;
  std::thread worker_;
};

}  // namespace

void bind_stream(nb::module_& m) {
  nb::class_<Stream>(m, "Stream")
      .def(nb::init<std::vector<std::string>, const PyLoadOptions&, uint64_t, std::optional<std::vector<std::string>>,
                    std::optional<std::vector<std::string>>, bool>(),
           "files"_a, "options"_a, "max_queued_bytes"_a = uint64_t{1} << 30, "only"_a.none() = nb::none(),
           "exclude"_a.none() = nb::none(), "ordered"_a = false)
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &Stream::next)
      .def("close", &Stream::close)
      .def("progress", &Stream::progress)
      .def("log", &Stream::log)
      .def("describe", &Stream::describe);
}

}  // namespace wlpy

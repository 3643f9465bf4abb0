// mpi_world(): MPI_COMM_WORLD as a Collective, through libweightlift_mpi.so
// (src/dist/mpi/), loaded on first use (see weightlift/collective.h).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <fmt/format.h>

#include "dist/mpi_abi.h"
#include "util/plugin.h"
#include "weightlift/collective.h"

namespace wl {

namespace {

constexpr const char* kLibName = "libweightlift_mpi.so";

struct Loaded {
  const WlMpiApi* api = nullptr;
  std::string reason;
};

const Loaded& plugin() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
  // The MPI library first, by the soname the plugin was compiled against: the
  // plugin does not name it as a dependency (src/dist/mpi/CMakeLists.txt).
  // RTLD_GLOBAL: the plugin's MPI symbols resolve against it, and Open MPI
  // loads its own components with dlopen and needs libmpi's symbols.
#ifdef WEIGHTLIFT_MPI_SONAME
    if (!::dlopen(WEIGHTLIFT_MPI_SONAME, RTLD_NOW | RTLD_GLOBAL)) {
      const char* e = ::dlerror();
      loaded.reason = fmt::format(
          "MPI is not available: {} cannot be loaded ({}); install the MPI library "
          "this weightlift was built against (Open MPI: Debian's libopenmpi3)",
          WEIGHTLIFT_MPI_SONAME, e ? e : "");
      return;
    }
#endif
    std::string errors;
    void* handle =
        open_plugin(plugin_candidates(kLibName, "WEIGHTLIFT_MPI_LIBRARY", reinterpret_cast<void*>(&mpi_world)),
                    RTLD_NOW | RTLD_GLOBAL, &errors);
    if (!handle) {
      loaded.reason = fmt::format(
          "MPI is not available: {} (built when MPI is found, e.g. Debian's libopenmpi-dev) "
          "cannot be loaded{}",
          kLibName, errors);
      return;
    }
    auto get = reinterpret_cast<const WlMpiApi* (*)()>(::dlsym(handle, "wl_mpi_api"));
    const WlMpiApi* api = get ? get() : nullptr;
    if (!api || api->abi_version != kWlMpiAbiVersion) {
      loaded.reason = fmt::format("{} does not match this weightlift build", kLibName);
      return;
    }
    loaded.api = api;
  });
  return loaded;
}

class MpiCollective final : public Collective {
 public:
  MpiCollective(const WlMpiApi* api, int rank, int size, std::chrono::milliseconds timeout)
      : api_(api), rank_(rank), size_(size), timeout_(timeout.count()) {}
  ~MpiCollective() override { api_->finalize(); }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  Device device() const override { return kCpu; }

  Status all_gather(std::byte* buf, uint64_t block) override {
    return check(api_->all_gather(buf, block, timeout_, err_, sizeof err_));
  }
  Status broadcast(std::byte* buf, uint64_t n, int root) override {
    if (root < 0 || root >= size_)
      return Status::InvalidArgument(fmt::format("broadcast root {} is outside [0, {})", root, size_));
    return check(api_->broadcast(buf, n, root, timeout_, err_, sizeof err_));
  }
  Result<std::vector<std::string>> all_gather_strings(const std::string& mine) override {
    std::vector<uint64_t> lens(static_cast<size_t>(size_));
    WL_RETURN_IF_ERROR(check(api_->all_gather_u64(mine.size(), lens.data(), timeout_, err_, sizeof err_)));
    uint64_t total = 0;
    for (uint64_t n : lens) {
      if (n > (uint64_t{64} << 20)) return Status::Aborted(fmt::format("a rank sent a {}-byte control message", n));
      total += n;
    }
    std::string all(static_cast<size_t>(total), '\0');
    WL_RETURN_IF_ERROR(check(api_->all_gather_v(mine.data(), lens.data(), all.data(), timeout_, err_, sizeof err_)));
    std::vector<std::string> out;
    uint64_t at = 0;
    for (uint64_t n : lens) {
      out.push_back(all.substr(static_cast<size_t>(at), static_cast<size_t>(n)));
      at += n;
    }
    return out;
  }
  // The group is broken (a call failed or timed out): end the whole job,
  // saying why first, since MPI_Abort does not return.
  void abort(const Status& why) override {
    std::fprintf(stderr, "weightlift: error: rank %d of %d: aborting the MPI job: %s\n", rank_, size_,
                 why.to_string().c_str());
    std::fflush(stderr);
    api_->abort(1);
  }

 private:
  Status check(int rc) {
    if (rc == 0) return Status();
    return Status::Aborted(fmt::format("rank {} of {}: {}", rank_, size_, err_));
  }

  const WlMpiApi* api_;
  int rank_, size_;
  int64_t timeout_;
  char err_[512] = {0};
};

}  // namespace

Result<std::unique_ptr<Collective>> mpi_world(std::chrono::milliseconds timeout) {
  const Loaded& p = plugin();
  if (!p.api) return Status::Unavailable(p.reason);
  int rank = 0, size = 0;
  char err[512] = {0};
  if (p.api->init(&rank, &size, err, sizeof err) != 0) return Status::Unavailable(std::string("MPI: ") + err);
  return std::unique_ptr<Collective>(std::make_unique<MpiCollective>(p.api, rank, size, timeout));
}

}  // namespace wl

// The host destinations: engine-owned buffers and the caller's memory.
#include <fmt/format.h>

#include "weightlift/destination.h"

namespace wl {

namespace {

class HostDestination final : public Destination {
 public:
  Device device() const override { return kCpu; }
  Result<Region> allocate(const TensorRequest& req) override {
    WL_ASSIGN_OR_RETURN(Buffer b, Buffer::allocate(static_cast<size_t>(req.nbytes)), .tensor = req.name);
    auto owner = std::make_shared<Buffer>(std::move(b));
    return Region{owner->data(), req.nbytes, kCpu, owner};
  }
};

class CallerDestination final : public Destination {
 public:
  CallerDestination(RegionFn fn, Device device, Uploader* up) : fn_(std::move(fn)), device_(device), up_(up) {}
  Device device() const override { return device_; }
  Result<Region> allocate(const TensorRequest& req) override {
    WL_ASSIGN_OR_RETURN(Region r, fn_(req));
    return r;
  }
  Uploader* uploader() override { return up_; }

 private:
  RegionFn fn_;
  Device device_;
  Uploader* up_;
};

}  // namespace

std::unique_ptr<Destination> host_destination() { return std::make_unique<HostDestination>(); }

std::unique_ptr<Destination> caller_destination(RegionFn fn, Device device, Uploader* uploader) {
  return std::make_unique<CallerDestination>(std::move(fn), device, uploader);
}

}  // namespace wl

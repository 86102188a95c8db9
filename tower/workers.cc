#include "tower/workers.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/collectives/communicator.h"
#include "core/error.h"
#include "core/tensor/device_ops.h"
#include "core/trace.h"

namespace towerflow::tower {

struct DeviceWorkers::Impl {
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::uint64_t generation = 0;   // bumped for each run()
  int remaining = 0;
  bool stopping = false;
  const std::function<void(int)>* fn = nullptr;
  const std::function<void(int, std::exception_ptr)>* on_error = nullptr;
  std::exception_ptr first_error;      // the first failure that is not a consequence
  std::exception_ptr first_any_error;  // the first failure of any kind
  std::vector<std::thread> threads;

  void loop(int i, const Device& device, const Bind& bind) {
    trace::set_thread_name(str("tower ", i, " (", device.str(), ")"));
    std::exception_ptr bind_error;
    try {
      if (bind) bind(device);
    } catch (...) {
      bind_error = std::current_exception();
    }
    // A GPU's kernels run on its stream: the trace times them there too (core/trace.h). A device
    // that cannot be used says so when the tower first uses it, not here.
    if (device.is_gpu()) {
      try {
        (void)backend_name(device);  // builds the device's backend, or says why it cannot
        trace::set_thread_device_queue(str(device.str(), " stream"), [device] { return record_timing_event(device); });
      } catch (const Error&) {
      }
    }
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* work;
      const std::function<void(int, std::exception_ptr)>* err;
      {
        std::unique_lock lock(mu);
        work_cv.wait(lock, [&] { return stopping || generation != seen; });
        if (stopping) return;
        seen = generation;
        work = fn;
        err = on_error;
      }
      std::exception_ptr failure = bind_error;
      if (!failure) {
        try {
          (*work)(i);
        } catch (...) {
          failure = std::current_exception();
        }
      }
      if (failure) {
        bool consequence = false;
        try {
          std::rethrow_exception(failure);
        } catch (const collectives::CollectiveAborted&) {
          consequence = true;
        } catch (...) {
        }
        {
          std::lock_guard lock(mu);
          if (!first_any_error) first_any_error = failure;
          if (!consequence && !first_error) first_error = failure;
        }
        if (err && *err) {
          try {
            (*err)(i, failure);
          } catch (...) {
          }
        }
      }
      {
        std::lock_guard lock(mu);
        if (--remaining == 0) done_cv.notify_all();
      }
    }
  }
};

DeviceWorkers::DeviceWorkers(std::vector<Device> devices, Bind bind)
    : devices_(std::move(devices)), impl_(std::make_unique<Impl>()) {
  if (devices_.empty()) raise<InvalidArgument>("towers need at least one device; the device list is empty");
  for (int i = 0; i < size(); ++i)
    impl_->threads.emplace_back([this, i, bind] { impl_->loop(i, devices_[i], bind); });
}

DeviceWorkers::~DeviceWorkers() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->work_cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

void DeviceWorkers::run(const std::function<void(int)>& fn,
                        const std::function<void(int, std::exception_ptr)>& on_error) {
  std::exception_ptr error;
  {
    std::unique_lock lock(impl_->mu);
    impl_->fn = &fn;
    impl_->on_error = &on_error;
    impl_->first_error = nullptr;
    impl_->first_any_error = nullptr;
    impl_->remaining = size();
    ++impl_->generation;
    impl_->work_cv.notify_all();
    impl_->done_cv.wait(lock, [&] { return impl_->remaining == 0; });
    error = impl_->first_error ? impl_->first_error : impl_->first_any_error;
    impl_->fn = nullptr;
    impl_->on_error = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace towerflow::tower

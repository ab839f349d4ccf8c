// A thread that calls poll(now) until stopped, sleeping as long as poll returns each time; stop()
// wakes it at once and joins it. The copy-engine and between-nodes watchdogs run on one each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/check.hpp"

namespace symmem::detail {

class PollingThread {
 public:
  using Clock = std::chrono::steady_clock;
  using Poll = std::function<Clock::duration(Clock::time_point)>;

  PollingThread() = default;
  ~PollingThread() { stop(); }
  PollingThread(const PollingThread&) = delete;
  PollingThread& operator=(const PollingThread&) = delete;

  void start(Poll poll) {
    thread_ = std::thread([this, poll = std::move(poll)] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stop_) {
        lock.unlock();
        const Clock::duration sleep = poll(Clock::now());
        lock.lock();
        wake_.wait_for(lock, sleep, [this] { return stop_; });
      }
    });
  }

  // Idempotent; never throws (a failure is logged).
  void stop() noexcept {
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      wake_.notify_all();
      if (thread_.joinable()) thread_.join();
    } catch (const std::exception& e) {
      log_warning(std::string("watchdog: stopping its thread failed: ") + e.what());
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace symmem::detail

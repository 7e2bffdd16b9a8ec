#pragma once
// bcrypt checks on threads of their own, so that the web server's event loops never wait for
// one. Internal to the web server.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ebpf_metricsd::http_internal {

// Runs jobs on a few threads of their own. Bounded: a job past `max_queued` waiting ones is
// refused.
class BcryptQueue {
 public:
  BcryptQueue(unsigned threads, std::size_t max_queued) : max_queued_(max_queued) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~BcryptQueue() { stop(); }
  BcryptQueue(const BcryptQueue&) = delete;
  BcryptQueue& operator=(const BcryptQueue&) = delete;

  // False when the queue is full or stopped; the job then never runs.
  bool submit(std::function<void()> job) {
    std::lock_guard lock(mutex_);
    if (stopping_ || jobs_.size() >= max_queued_) return false;
    jobs_.push_back(std::move(job));
    ready_.notify_one();
    return true;
  }
  // Runs the jobs queued and waits for them; refuses new ones from now on.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  const std::size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ebpf_metricsd::http_internal

#pragma once
// Work the web server's event loops must not wait for (bcrypt checks, rendering a scrape),
// on threads of their own. Internal to the web server.

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ebpf_metricsd::http_internal {

class WorkQueue {
 public:
  // A job and what to do instead when it is dropped at stop. Each must end the wait of
  // whoever queued the job (resume its connection), whatever happens.
  struct Job {
    std::function<void()> run;
    std::function<void()> cancel;
  };

  // `threads` run jobs; at most `max_waiting` wait for one.
  WorkQueue(unsigned threads, std::size_t max_waiting) : max_waiting_(max_waiting) {
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkQueue() { stop(); }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `job` unless the queue is full or stopped (false: nothing ran). `before` runs
  // first, under the queue's lock, so the job cannot start before it has (suspending the
  // connection the job will resume).
  bool submit(Job job, const std::function<void()>& before) {
    std::lock_guard lock(mutex_);
    if (stopping_ || jobs_.size() >= max_waiting_) return false;
    jobs_.push_back(std::move(job));
    before();
    ready_.notify_one();
    return true;
  }

  // Refuses new jobs, cancels the waiting ones and waits for those running.
  void stop() {
    std::deque<Job> dropped;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      dropped.swap(jobs_);
    }
    ready_.notify_all();
    for (auto& job : dropped) guarded(job.cancel);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  static void guarded(const std::function<void()>& f) noexcept {
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::error("web server: a background job failed: {}", e.what());
    } catch (...) {
      spdlog::error("web server: a background job failed");
    }
  }
  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      guarded(job.run);
    }
  }

  const std::size_t max_waiting_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: start once the rest is built
};

}  // namespace ebpf_metricsd::http_internal

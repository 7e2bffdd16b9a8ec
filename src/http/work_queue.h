#pragma once
// Work the web server's event loops must not wait for (bcrypt checks, rendering a scrape),
// on threads of their own. Internal to the web server.

#include <spdlog/spdlog.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace ebpf_metricsd::http_internal {

// Runs `f`, logging what it throws: a job must never end a server thread.
inline void run_guarded(const std::function<void()>& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    spdlog::error("web server: a background job failed: {}", e.what());
  } catch (...) {
    spdlog::error("web server: a background job failed");
  }
}

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
    for (auto& job : dropped) run_guarded(job.cancel);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
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
      run_guarded(job.run);
    }
  }

  const std::size_t max_waiting_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;  // last: start once the rest is built
};

// Jobs that run after a wait, each on this one thread (which should only hand them on:
// a job that takes time delays the next).
class DelayedJobs {
 public:
  using Job = WorkQueue::Job;
  DelayedJobs() : thread_([this] { run(); }) {}
  ~DelayedJobs() { stop(); }
  DelayedJobs(const DelayedJobs&) = delete;
  DelayedJobs& operator=(const DelayedJobs&) = delete;

  // Queues `job` to run `after` from now, unless stopped (false: nothing ran). `before`
  // runs first, under the lock, as in WorkQueue::submit.
  bool submit(std::chrono::milliseconds after, Job job, const std::function<void()>& before) {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    jobs_.emplace(std::chrono::steady_clock::now() + after, std::move(job));
    before();
    changed_.notify_one();
    return true;
  }

  // Cancels the waiting jobs and ends the thread.
  void stop() {
    std::multimap<std::chrono::steady_clock::time_point, Job> dropped;
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      dropped.swap(jobs_);
    }
    changed_.notify_all();
    thread_.join();
    for (auto& [when, job] : dropped) run_guarded(job.cancel);
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      if (jobs_.empty()) {
        changed_.wait(lock);
        continue;
      }
      const auto first = jobs_.begin();
      if (first->first > std::chrono::steady_clock::now()) {
        changed_.wait_until(lock, first->first);
        continue;
      }
      Job job = std::move(first->second);
      jobs_.erase(first);
      lock.unlock();
      run_guarded(job.run);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::multimap<std::chrono::steady_clock::time_point, Job> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace ebpf_metricsd::http_internal

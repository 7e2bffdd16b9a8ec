#pragma once
// The scheduler oracle (oracle/sched_oracle.bpf.c) loaded and attached: an independent
// count, at the same sched_switch and sched_wakeup tracepoints the tracers use, of one
// thread's or one cgroup's returns to a CPU, and of the returns no program could see. (A
// task's voluntary_ctxt_switches and the scheduler's own count of its switch-ins are no
// oracle for a tracer: where the task switching out is one in whose context no BPF program
// runs, as the threads of some hosts' PID 1, the switch-in reaches no program; README,
// wake_missed.)

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "ebpf_metricsd/bpf/hook_probe.h"
#include "sched_oracle.skel.h"

namespace ebpf_metricsd::test {

class SchedOracle {
 public:
  SchedOracle() : skel_(sched_oracle__open(), sched_oracle__destroy) {
    REQUIRE(skel_);
    const bool has_prev_state = tracepoint_arg_count("sched_switch").value_or(4) == 4;
    bpf_program__set_autoload(skel_->progs.oracle_switch, has_prev_state);
    bpf_program__set_autoload(skel_->progs.oracle_switch_3arg, !has_prev_state);
    REQUIRE(sched_oracle__load(skel_.get()) == 0);
    REQUIRE(sched_oracle__attach(skel_.get()) == 0);
  }
  // Counts the thread `tid` from now on.
  void target_thread(int tid) {
    skel_->bss->target_tid = tid;
    clear_state();
  }
  // Counts the tasks of the cgroup v2 with id `id` from now on (none of them running yet).
  void target_cgroup(std::uint64_t id) {
    skel_->bss->target_cgroup = id;
    clear_state();
  }
  // Counts the tasks named `comm` from now on.
  void target_comm(const std::string& comm) {
    std::memset(skel_->bss->target_comm, 0, sizeof skel_->bss->target_comm);
    std::memcpy(skel_->bss->target_comm, comm.data(),
                std::min(comm.size(), sizeof skel_->bss->target_comm - 1));
    clear_state();
  }
  std::uint64_t returns_from_blocking() const {
    require_tracked();
    return __atomic_load_n(&skel_->bss->returns_from_blocking, __ATOMIC_SEQ_CST);
  }
  std::uint64_t returns_from_queue() const {
    require_tracked();
    return __atomic_load_n(&skel_->bss->returns_from_queue, __ATOMIC_SEQ_CST);
  }
  // Time from each blocking switch-out to the switch-in after it, in seconds.
  double blocked_seconds() const {
    require_tracked();
    return static_cast<double>(__atomic_load_n(&skel_->bss->blocked_ns, __ATOMIC_SEQ_CST)) / 1e9;
  }
  // Returns from blocking that reached no program: the target switched out again with no
  // switch-in seen since it blocked (oracle/sched_oracle.bpf.c says when that happens).
  std::uint64_t unseen_returns() const {
    require_tracked();
    return __atomic_load_n(&skel_->bss->unseen_returns, __ATOMIC_SEQ_CST);
  }
  // Those of thread `tid` (since the oracle was loaded, whatever the target was).
  std::uint64_t unseen_returns(int tid) const {
    require_tracked();
    const auto key = static_cast<std::uint32_t>(tid);
    std::uint64_t n = 0;
    return bpf_map__lookup_elem(skel_->maps.unseen_by_tid, &key, sizeof key, &n, sizeof n, 0) == 0
               ? n
               : 0;
  }
  // Last switch-outs of the target's tasks that exited. A task's last switch-out comes after
  // wait4() or pthread_join() returned; a test that reads unseen_returns() waits for it first.
  std::uint64_t dead_switch_outs() const {
    require_tracked();
    return __atomic_load_n(&skel_->bss->dead_switch_outs, __ATOMIC_SEQ_CST);
  }
  // Switch-outs of the target in which it was not runnable, as the tracepoint saw them.
  std::uint64_t blocked_switch_outs() const {
    require_tracked();
    return __atomic_load_n(&skel_->bss->blocked_switch_outs, __ATOMIC_SEQ_CST);
  }

 private:
  // Every count above is exact only if the oracle followed every task of the target.
  void require_tracked() const {
    INFO("tasks of the target the oracle could not follow (its maps full)");
    REQUIRE(__atomic_load_n(&skel_->bss->untracked, __ATOMIC_SEQ_CST) == 0);
  }
  // The tasks' states from before count as unset (the state of a task's last switch-out).
  void clear_state() { __atomic_add_fetch(&skel_->bss->generation, 1, __ATOMIC_SEQ_CST); }
  std::unique_ptr<sched_oracle, void (*)(sched_oracle*)> skel_;
};

}  // namespace ebpf_metricsd::test

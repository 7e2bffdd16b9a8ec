// A library the swap workload loads and unloads (swap_workload.c), built twice with other
// names and frame shapes: SWAP_NAME (a, b) names its functions run_<name> and spin_<name>, and
// SWAP_PAD bytes of locals give run_<name> a frame of its own size, so that a walk of one
// library's code with the other's table would go astray.
#define CAT(a, b) a##b
#define NAME(prefix, n) CAT(prefix, n)

static volatile unsigned long sink;

__attribute__((noinline, noipa)) void NAME(spin_, SWAP_NAME)(unsigned long n) {
  unsigned long x = sink;

  for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

// Spins until the thread has used `cpu_ns` more of CPU time; its frame holds SWAP_PAD bytes.
__attribute__((noinline, noipa)) void NAME(run_, SWAP_NAME)(long long until_ns,
                                                            long long (*now_ns)(void)) {
  volatile char pad[SWAP_PAD + 1];

  pad[0] = 1;
  while (now_ns() < until_ns) NAME(spin_, SWAP_NAME)(20000 + pad[0]);
}

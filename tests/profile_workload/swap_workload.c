// A process that unloads a library and loads another in its place, again and again, as a
// plugin host does (dlopen/dlclose):
//   swap_workload LIB_A LIB_B ROUNDS MS
// Each round loads LIB_A, spends MS ms of CPU in it (main -> swap_round -> run_a -> spin_a),
// unloads it, and does the same with LIB_B (run_b, spin_b). Two libraries of the same size
// usually land at the same address in turn (printed: "same_address N" of the rounds), so a
// walk that used one library's unwind table for the other's code would go astray.
// With PROFILE_WORKLOAD_GATE set, each load is announced on standard output ("loaded a" or
// "loaded b") and the library's code spins until SIGUSR1 before its MS ms: a test lets it go
// once the profiler has read the process with the library in it, at any speed.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int gated;
static volatile sig_atomic_t gate_open;
static void open_gate(int sig) {
  (void)sig;
  gate_open = 1;
}

static long long cpu_ns(void) {
  struct timespec t;

  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

typedef void (*run_fn)(long long until_ns, long long (*now_ns)(void));

// Loads `lib`, runs its `run` for `ms` of CPU, unloads it; where it was loaded.
__attribute__((noinline, noipa)) void *swap_round(const char *lib, const char *run, long ms) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  Dl_info info = {0};
  run_fn f;

  if (!h) {
    fprintf(stderr, "%s\n", dlerror());
    exit(1);
  }
  f = (run_fn)dlsym(h, run);
  if (!f || !dladdr((void *)f, &info)) exit(1);
  if (gated) {
    printf("loaded %s\n", run + 4);
    fflush(stdout);
    while (!gate_open) f(cpu_ns() + 1000000LL, cpu_ns);
    gate_open = 0;
  }
  f(cpu_ns() + ms * 1000000LL, cpu_ns);
  dlclose(h);
  return info.dli_fbase;
}

int main(int argc, char **argv) {
  int same = 0;

  if (argc != 5) return 2;
  if (getenv("PROFILE_WORKLOAD_GATE")) {
    struct sigaction go = {.sa_handler = open_gate};

    gated = 1;
    sigaction(SIGUSR1, &go, NULL);
  }
  for (int i = 0; i < atoi(argv[3]); i++) {
    const void *a = swap_round(argv[1], "run_a", atol(argv[4]));
    const void *b = swap_round(argv[2], "run_b", atol(argv[4]));

    same += a == b;
  }
  printf("same_address %d\n", same);
  return 0;
}

// The known workload of the profile tests, built with frame pointers and without (as
// Debian builds), calling the C library as real programs do:
//  - the main thread runs rounds of hot_three() and hot_one(), the same loop for 3 and 1
//    units of work in turn (on-CPU time 3:1 between them, at any machine speed; hot_three's
//    is in spin_three(), inlined into it; each round's unit is drawn between 0.5 and 1.5
//    of UNIT, so that a sampling period near a round's length cannot lock onto the same
//    part of every round, as fixed rounds let it in a slow guest), and of
//    sort_round(), a qsort() whose comparison function compare_slowly() spins: a leaf
//    called back through the C library, which keeps no frame pointers. All under
//    main -> run_rounds -> one_round. The loops call tick() now and then, so that they
//    are not leaf functions: GCC gives a leaf without stack use no frame even with
//    -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer;
//  - a reader thread blocks in read(2), called through the C library from wait_on_pipe()
//    (reader -> read_all -> wait_on_pipe -> read), until a feeder thread writes a byte,
//    which it does only once the reader has switched out inside read(2), and 20 ms later:
//    every read blocks;
//  - a waiter thread blocks in pthread_cond_wait() from wait_for_signal() (waiter ->
//    wait_all -> wait_for_signal), signalled by the feeder the same way.
// Usage: profile_workload CPU_MS READS: rounds until the main thread has used CPU_MS of
// CPU time (so that a profile at F Hz takes about CPU_MS * F / 1000 samples of them on
// any machine), and READS blocking reads and as many condition waits. Prints "blocked_ns
// N" (the reader's time in read), "cond_ns N" (the waiter's in pthread_cond_wait), each
// less the CPU time the thread used meanwhile (the time it was off the CPU, which a slow
// or emulated machine makes a smaller part of the call), and "rounds N". A third argument
// "hold" keeps the process until its standard input ends, for a test to name its stacks
// while it lives. With PROFILE_WORKLOAD_GATE in its environment it first spins in warm_up()
// until SIGUSR1, before its threads start and before CPU_MS begins to count: a test whose
// stacks are walked in the kernel waits until a walk of warm_up() reaches main (the process's
// mappings read, its files' tables loaded), so that what it measures is not its first
// milliseconds.
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define UNIT 200000UL

static volatile unsigned long sink;
static int fds[2];
static int reads;
static long long blocked_ns;
static long long cond_ns;
static volatile long reader_switches_before = -1, waiter_switches_before = -1;
static volatile pid_t reader_tid, waiter_tid;
static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int signalled;

static long long clock_ns(clockid_t clock) {
  struct timespec t;

  clock_gettime(clock, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
/* Time off the CPU: wall time less the calling thread's CPU time. */
static long long off_cpu_ns(void) { return now_ns() - clock_ns(CLOCK_THREAD_CPUTIME_ID); }

/* The threads' CPU time, each thread's as it ends (before its exit begins): a lower bound of
 * what the kernel accounts to each by its exit, printed as threads_cpu_ns. */
static long long threads_cpu_ns;
static void thread_done(void) {
  __atomic_fetch_add(&threads_cpu_ns, clock_ns(CLOCK_THREAD_CPUTIME_ID), __ATOMIC_RELAXED);
}

__attribute__((noinline, noipa)) void tick(void) { __asm__ volatile(""); }

#define SPIN(n)                                              \
  do {                                                       \
    unsigned long x = sink;                                  \
    for (unsigned long i = 0; i < (n); i++) {                \
      x = x * 6364136223846793005UL + 1442695040888963407UL; \
      if ((i & 4095) == 0) tick();                           \
    }                                                        \
    sink = x;                                                \
  } while (0)

static volatile sig_atomic_t gate_open;
static void open_gate(int sig) {
  (void)sig;
  gate_open = 1;
}

__attribute__((noinline, noipa)) void warm_up(void) {
  while (!gate_open) SPIN(UNIT / 8);
}

// hot_three's loop, inlined into it: with source lines, a frame of its own (and the line
// below, which tests find by its marker, the hottest line of the program).
static inline __attribute__((always_inline)) void spin_three(unsigned long unit) {
  SPIN(3 * unit); /* the hot line */
}

__attribute__((noinline, noipa)) void hot_three(unsigned long unit) { spin_three(unit); }

__attribute__((noinline, noipa)) void hot_one(unsigned long unit) { SPIN(unit); }

static long voluntary_switches(void) {
  struct rusage ru;

  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_nvcsw;
}

__attribute__((noinline, noipa)) long wait_on_pipe(void *buf) {
  long ret = read(fds[0], buf, 1);

  tick(); /* not a leaf: it keeps a frame where frame pointers are on */
  return ret;
}

__attribute__((noinline, noipa)) void read_all(void) {
  char c;

  for (int i = 0; i < reads; i++) {
    long long t0 = off_cpu_ns();

    reader_switches_before = voluntary_switches();
    if (wait_on_pipe(&c) != 1) exit(2);
    blocked_ns += off_cpu_ns() - t0;
  }
}

static void *reader(void *arg) {
  (void)arg;
  reader_tid = (pid_t)syscall(SYS_gettid);
  read_all();
  thread_done();
  return NULL;
}

__attribute__((noinline, noipa)) void wait_for_signal(void) {
  pthread_mutex_lock(&mutex);
  while (!signalled) pthread_cond_wait(&cond, &mutex);
  signalled = 0;
  pthread_mutex_unlock(&mutex);
  tick();
}

__attribute__((noinline, noipa)) void wait_all(void) {
  for (int i = 0; i < reads; i++) {
    long long t0 = off_cpu_ns();

    waiter_switches_before = voluntary_switches();
    wait_for_signal();
    cond_ns += off_cpu_ns() - t0;
  }
}

static void *waiter(void *arg) {
  (void)arg;
  waiter_tid = (pid_t)syscall(SYS_gettid);
  wait_all();
  thread_done();
  return NULL;
}

// Thread tid's /proc/self/task/TID/`file` into text (NUL-terminated); 0 when unread.
// pread(2), not read(2): the reader's reads are the process's only read(2) calls.
static int task_file(volatile pid_t *tid, const char *file, char *text, size_t size) {
  char path[64];
  ssize_t n;
  int fd;

  if (!*tid) return 0;
  snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)*tid, file);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  n = pread(fd, text, size - 1, 0);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  return 1;
}
// Whether thread tid has switched out since it stored its count in *before (state S
// alone shows before the switch).
static int blocked_since(volatile pid_t *tid, volatile long *before) {
  char text[2048];
  const char *at;
  long switches = -1;
  char state = '?';

  if (!task_file(tid, "status", text, sizeof text)) return 0;
  if ((at = strstr(text, "\nState:"))) sscanf(at + 7, " %c", &state);
  if ((at = strstr(text, "\nvoluntary_ctxt_switches:"))) switches = strtol(at + 25, NULL, 10);
  return state == 'S' && *before >= 0 && switches > *before;
}
// Whether thread tid is inside system call nr (its /proc syscall file starts with it): a
// thread can switch out asleep elsewhere first (a lock of the dynamic loader), and then find
// its byte waiting when it reaches the call.
static int in_syscall(volatile pid_t *tid, int nr) {
  char text[64];

  if (!task_file(tid, "syscall", text, sizeof text)) return 0;
  return text[0] >= '0' && text[0] <= '9' && (int)strtol(text, NULL, 10) == nr;
}

static void *feeder(void *arg) {
  const struct timespec wait = {0, 20 * 1000 * 1000}, poll = {0, 100 * 1000};

  (void)arg;
  for (int i = 0; i < reads; i++) {
    while (!blocked_since(&reader_tid, &reader_switches_before) || !in_syscall(&reader_tid, 0))
      nanosleep(&poll, NULL);
    nanosleep(&wait, NULL);
    reader_switches_before = -1;
    if (write(fds[1], "x", 1) != 1) exit(2);
    while (!blocked_since(&waiter_tid, &waiter_switches_before)) nanosleep(&poll, NULL);
    nanosleep(&wait, NULL);
    waiter_switches_before = -1;
    pthread_mutex_lock(&mutex);
    signalled = 1;
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&mutex);
  }
  thread_done();
  return NULL;
}

__attribute__((noinline, noipa)) int compare_slowly(const void *a, const void *b) {
  const int x = *(const int *)a, y = *(const int *)b;

  SPIN(UNIT / 64);
  return (x > y) - (x < y);
}

__attribute__((noinline, noipa)) void sort_round(void) {
  int v[16];

  for (int i = 0; i < 16; i++) v[i] = (i * 7919) % 16;
  qsort(v, 16, sizeof v[0], compare_slowly);
  tick();
}

__attribute__((noinline, noipa)) void one_round(void) {
  static unsigned long state = 1;
  unsigned long unit;

  state = state * 6364136223846793005UL + 1442695040888963407UL;
  unit = UNIT / 2 + (state >> 33) % UNIT;
  hot_three(unit);
  hot_one(unit);
  sort_round();
}

__attribute__((noinline, noipa)) long long run_rounds(long long cpu_ns) {
  long long rounds = 0;

  /* Whole rounds only: the 3:1 split holds however the time is cut. */
  while (clock_ns(CLOCK_THREAD_CPUTIME_ID) < cpu_ns) {
    one_round();
    rounds++;
  }
  return rounds;
}

/* run_rounds under `depth` + 1 frames of its own (PROFILE_WORKLOAD_DEPTH=depth + 1, unset in
 * the tests): the benchmarks' deep stacks. Not a tail call, not inlined: each level is a frame
 * the walk must pass. */
__attribute__((noinline, noipa)) long long run_deeper(int depth, long long cpu_ns) {
  long long rounds;

  if (depth <= 0) return run_rounds(cpu_ns);
  rounds = run_deeper(depth - 1, cpu_ns);
  __asm__ volatile("" : "+r"(rounds));
  return rounds;
}

int main(int argc, char **argv) {
  pthread_t r, w, f;
  long long rounds;
  const char *depth = getenv("PROFILE_WORKLOAD_DEPTH");

  if (argc != 3 && !(argc == 4 && strcmp(argv[3], "hold") == 0)) return 2;
  reads = atoi(argv[2]);
  if (getenv("PROFILE_WORKLOAD_GATE")) {
    struct sigaction go = {.sa_handler = open_gate};

    sigaction(SIGUSR1, &go, NULL);
    warm_up();
  }
  if (pipe(fds) != 0) return 2;
  pthread_create(&r, NULL, reader, NULL);
  pthread_create(&w, NULL, waiter, NULL);
  pthread_create(&f, NULL, feeder, NULL);
  rounds = depth ? run_deeper(atoi(depth) - 1,
                              clock_ns(CLOCK_THREAD_CPUTIME_ID) + atoll(argv[1]) * 1000000LL)
                 : run_rounds(clock_ns(CLOCK_THREAD_CPUTIME_ID) + atoll(argv[1]) * 1000000LL);
  pthread_join(r, NULL);
  pthread_join(w, NULL);
  pthread_join(f, NULL);
  thread_done();
  printf("blocked_ns %lld\ncond_ns %lld\nrounds %lld\nthreads_cpu_ns %lld\n", blocked_ns, cond_ns,
         rounds, __atomic_load_n(&threads_cpu_ns, __ATOMIC_RELAXED));
  fflush(stdout);
  if (argc == 4) { /* hold: live on until standard input ends (poll, not read: the reader's
                       reads stay the process's only read(2) calls) */
    struct pollfd in = {.fd = STDIN_FILENO, .events = POLLIN};
    while (poll(&in, 1, -1) < 0) {
    }
  }
  return 0;
}

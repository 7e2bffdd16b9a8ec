// The known workload of the profile tests, built with frame pointers and without:
//  - the main thread runs hot_three() and hot_one(), the same loop for 3 and 1 units of
//    work in turn: on-CPU time 3:1 between them, at any machine speed. Both call tick() now
//    and then, so that they are not leaf functions: GCC gives a leaf without stack use no
//    frame even with -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer, and a sample in
//    a frameless function skips its caller;
//  - a reader thread blocks in wait_on_pipe() (a read(2) issued from that function itself,
//    so that it is the innermost user frame with or without frame pointers) until a feeder
//    thread writes a byte, which it does only once the reader has switched out, and 20 ms
//    later: every read blocks.
// Usage: profile_workload CPU_MS READS: rounds of hot_three() + hot_one() until the main
// thread has used CPU_MS of CPU time (so that a profile at F Hz takes about CPU_MS * F / 1000
// samples of them on any machine), and READS blocking reads. Prints "blocked_ns N" (the
// reader's time in read) and "rounds N" (the work done).
#define _GNU_SOURCE
#include <pthread.h>
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
static volatile long reader_switches_before = -1;
static volatile pid_t reader_tid;

static long long clock_ns(clockid_t clock)
{
	struct timespec t;

	clock_gettime(clock, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

__attribute__((noinline, noipa)) void tick(void)
{
	__asm__ volatile("");
}

#define SPIN(n)                                                                \
	do {                                                                   \
		unsigned long x = sink;                                        \
		for (unsigned long i = 0; i < (n); i++) {                      \
			x = x * 6364136223846793005UL + 1442695040888963407UL; \
			if ((i & 4095) == 0)                                   \
				tick();                                        \
		}                                                              \
		sink = x;                                                      \
	} while (0)

__attribute__((noinline, noipa)) void hot_three(void)
{
	SPIN(3 * UNIT);
}

__attribute__((noinline, noipa)) void hot_one(void)
{
	SPIN(UNIT);
}

static long voluntary_switches(void)
{
	struct rusage ru;

	getrusage(RUSAGE_THREAD, &ru);
	return ru.ru_nvcsw;
}

__attribute__((noinline, noipa)) long wait_on_pipe(void *buf)
{
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "0"((long)SYS_read), "D"((long)fds[0]), "S"(buf), "d"(1L)
			 : "rcx", "r11", "memory");
	tick(); /* not a leaf: it keeps a frame where frame pointers are on */
	return ret;
}

static void *reader(void *arg)
{
	char c;

	(void)arg;
	reader_tid = (pid_t)syscall(SYS_gettid);
	for (int i = 0; i < reads; i++) {
		long long t0 = now_ns();

		reader_switches_before = voluntary_switches();
		if (wait_on_pipe(&c) != 1)
			exit(2);
		blocked_ns += now_ns() - t0;
	}
	return NULL;
}

// Whether the reader has switched out since it stored its count (state S alone shows
// before the switch).
static int reader_blocked(void)
{
	char path[64], line[256];
	long switches = -1;
	char state = '?';
	FILE *f;

	snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)reader_tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		if (!strncmp(line, "State:", 6))
			sscanf(line + 6, " %c", &state);
		else if (!strncmp(line, "voluntary_ctxt_switches:", 24))
			switches = strtol(line + 24, NULL, 10);
	}
	fclose(f);
	return state == 'S' && reader_switches_before >= 0 &&
	       switches > reader_switches_before;
}

static void *feeder(void *arg)
{
	const struct timespec wait = {0, 20 * 1000 * 1000}, poll = {0, 100 * 1000};

	(void)arg;
	for (int i = 0; i < reads; i++) {
		while (!reader_tid || !reader_blocked())
			nanosleep(&poll, NULL);
		nanosleep(&wait, NULL);
		reader_switches_before = -1;
		if (write(fds[1], "x", 1) != 1)
			exit(2);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t r, f;
	long long cpu_ns, rounds = 0;

	if (argc != 3)
		return 2;
	cpu_ns = atoll(argv[1]) * 1000000LL;
	reads = atoi(argv[2]);
	if (pipe(fds) != 0)
		return 2;
	pthread_create(&r, NULL, reader, NULL);
	pthread_create(&f, NULL, feeder, NULL);
	/* Whole rounds only: the 3:1 split holds however the time is cut. */
	while (clock_ns(CLOCK_THREAD_CPUTIME_ID) < cpu_ns) {
		hot_three();
		hot_one();
		rounds++;
	}
	pthread_join(r, NULL);
	pthread_join(f, NULL);
	printf("blocked_ns %lld\nrounds %lld\n", blocked_ns, rounds);
	return 0;
}

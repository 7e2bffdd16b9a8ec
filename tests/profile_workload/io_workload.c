// The slow-event tests' known workload, built with frame pointers and without (as Debian
// builds), calling the C library as real programs do; its events are waited for inside the
// system call that starts them:
//   io_workload connect PORT N   N blocking connect()s to 127.0.0.1:PORT, each from
//                                main -> connect_all -> connect_once -> connect
//   io_workload write DEVICE N [KIB]
//                                N O_DIRECT pwrite()s of KIB KiB (4 by default, a multiple of 4)
//                                to DEVICE, every other block from the start, from
//                                main -> write_all -> write_block -> pwrite
// Then it stays until its standard input closes (for its stacks to be named while it lives)
// and exits 0; 1 when a call failed. With PROFILE_WORKLOAD_GATE in its environment it first
// spins in warm_up() until SIGUSR1: a test whose events are walked in the kernel lets it go
// once a walk of it reaches main (its mappings read, its files' tables loaded), so that the
// events it measures are not its first milliseconds.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

__attribute__((noinline, noipa)) void tick(void) { __asm__ volatile(""); }

static volatile sig_atomic_t gate_open;
static void open_gate(int sig) {
  (void)sig;
  gate_open = 1;
}

__attribute__((noinline, noipa)) void warm_up(void) {
  static volatile unsigned long sink;

  while (!gate_open) {
    for (unsigned long i = 0; i < 100000; i++) sink = sink * 6364136223846793005UL + i;
    tick();
  }
}

__attribute__((noinline, noipa)) int connect_once(const struct sockaddr_in *to) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int ok;

  if (fd < 0) return 0;
  ok = connect(fd, (const struct sockaddr *)to, sizeof *to) == 0;
  tick(); /* not a leaf: it keeps a frame where frame pointers are on */
  close(fd);
  return ok;
}

__attribute__((noinline, noipa)) int connect_all(int port, int n) {
  struct sockaddr_in to;

  memset(&to, 0, sizeof to);
  to.sin_family = AF_INET;
  to.sin_port = htons((unsigned short)port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < n; i++) {
    if (!connect_once(&to)) return 0;
  }
  tick();
  return 1;
}

__attribute__((noinline, noipa)) int write_block(int fd, const void *buf, long size, long offset) {
  const int ok = pwrite(fd, buf, (size_t)size, offset) == size;

  tick();
  return ok;
}

__attribute__((noinline, noipa)) int write_all(const char *device, int n, long size) {
  const int fd = open(device, O_WRONLY | O_DIRECT | O_CLOEXEC);
  void *buf = NULL;

  if (fd < 0 || size <= 0 || size % 4096 || posix_memalign(&buf, 4096, (size_t)size) != 0) return 0;
  memset(buf, 0xcd, (size_t)size);
  for (int i = 0; i < n; i++) {
    if (!write_block(fd, buf, size, (long)i * 2 * size)) return 0;
  }
  close(fd);
  free(buf);
  tick();
  return 1;
}

int main(int argc, char **argv) {
  char c;
  int ok;

  if (argc != 4 && !(argc == 5 && strcmp(argv[1], "write") == 0)) return 2;
  if (getenv("PROFILE_WORKLOAD_GATE")) {
    struct sigaction go = {.sa_handler = open_gate};

    sigaction(SIGUSR1, &go, NULL);
    warm_up();
  }
  if (strcmp(argv[1], "connect") == 0)
    ok = connect_all(atoi(argv[2]), atoi(argv[3]));
  else if (strcmp(argv[1], "write") == 0)
    ok = write_all(argv[2], atoi(argv[3]), argc == 5 ? atol(argv[4]) * 1024 : 4096);
  else
    return 2;
  while (read(0, &c, 1) > 0) {
  }
  return ok ? 0 : 1;
}

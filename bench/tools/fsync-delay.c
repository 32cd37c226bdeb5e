/*
 * A PostgreSQL server whose WAL flush takes as long as a network volume's: every fsync and
 * fdatasync of the process waits FSYNC_DELAY_US microseconds (default 1000) before it runs.
 * For benchmarks only (docs/benchmarks.md, "Pickup on a server whose WAL flush takes a
 * millisecond"; docs/adr/0042-claims-commit-asynchronously.md).
 *
 *   gcc -shared -fPIC -O2 -o /tmp/fsync-delay.so bench/tools/fsync-delay.c -ldl
 *   runuser -u postgres -- env LD_PRELOAD=/tmp/fsync-delay.so FSYNC_DELAY_US=1000 \
 *     /usr/lib/postgresql/15/bin/pg_ctl -D <data> -l <log> -o "-p <port> …" start
 *
 * Check: a one-row INSERT through pgbench takes about a millisecond more than without it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

static useconds_t delay_us(void) {
  const char *value = getenv("FSYNC_DELAY_US");
  return value ? (useconds_t)atoi(value) : 1000;
}

int fdatasync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  usleep(delay_us());
  return real(fd);
}

int fsync(int fd) {
  static int (*real)(int);
  if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  usleep(delay_us());
  return real(fd);
}

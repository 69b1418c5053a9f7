/* Runs one command and writes its wall time, CPU time and peak RSS to a file: the benchmark's stopwatch.
 *
 * usage: measure RESULT_FILE COMMAND [ARG...]
 * RESULT_FILE gets one line: "<wall s> <user s> <sys s> <peak RSS KiB> <exit code>" (exit code 128+N when
 * killed by signal N, 127 when COMMAND cannot be started). The command inherits stdin/stdout/stderr.
 *
 * Why not measure from Python: a child's ru_maxrss includes the RSS of the process it was forked from
 * (Linux keeps the pre-exec high-water mark), so children of the benchmark script, which holds models in
 * memory, would all report hundreds of MB. Forked from this small program the baseline is about 1 MB.
 * Compiled on demand by run_bench.py (cc -O2). */

#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double seconds(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec / 1e6; }

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s RESULT_FILE COMMAND [ARG...]\n", argv[0]);
    return 2;
  }
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  const pid_t child = fork();
  if (child < 0) {
    fprintf(stderr, "measure: fork: %s\n", strerror(errno));
    return 2;
  }
  if (child == 0) {
    execvp(argv[2], argv + 2);
    fprintf(stderr, "measure: cannot run %s: %s\n", argv[2], strerror(errno));
    _exit(127);
  }
  int status = 0;
  struct rusage usage;
  while (wait4(child, &status, 0, &usage) < 0) {
    if (errno != EINTR) {
      fprintf(stderr, "measure: wait4: %s\n", strerror(errno));
      return 2;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &end);
  const double wall = (double)(end.tv_sec - start.tv_sec) + (double)(end.tv_nsec - start.tv_nsec) / 1e9;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255;
  FILE* out = fopen(argv[1], "w");
  if (!out) {
    fprintf(stderr, "measure: cannot write %s: %s\n", argv[1], strerror(errno));
    return 2;
  }
  fprintf(out, "%.6f %.6f %.6f %ld %d\n", wall, seconds(usage.ru_utime), seconds(usage.ru_stime), usage.ru_maxrss,
          code);
  return fclose(out) == 0 ? 0 : 2;
}

/*
 * bench/benchclock.h — the clocks the benchmarks read: wall time, this process's CPU,
 * and another process's CPU from the scheduler's own count.
 *
 * Header only (static inline): each benchmark is one file, built by itself.
 */
#ifndef BENCH_BENCHCLOCK_H
#define BENCH_BENCHCLOCK_H

#include <math.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>

/* Monotonic wall seconds. */
static inline double bh_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* This process's CPU seconds, user and system. */
static inline double bh_cpu(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* CPU seconds process `pid` (0: this one) has used so far, all its threads, those that
 * have exited too, in nanoseconds: /proc/PID/stat's 10 ms ticks are too coarse for a
 * run of a fraction of a second.  NAN where it cannot be read (the process is gone). */
static inline double bh_cpu_of(pid_t pid)
{
  clockid_t id;
  struct timespec ts;
  if (clock_getcpuclockid(pid, &id) != 0 || clock_gettime(id, &ts) != 0)
    return NAN;
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif

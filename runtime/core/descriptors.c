/*
 * descriptors.c — berth_reserve_descriptors (berth.h): the process's descriptor table,
 * grown once, so that it does not grow by doubling while the loop serves.
 *
 * The kernel makes the table bigger as descriptors are opened: 64 slots, then 128, 256
 * and so on.  In a process with more than one thread (a store's writer, a game's own
 * threads) each growth waits for an RCU grace period on the thread that opened the
 * descriptor: 11.7-15.5 ms on the project's VM at 256, 512 and 1 024 slots, against
 * 0.7 ms for 1 100 opens with one thread (docs/performance.md §8).  That thread is the
 * loop's, in the middle of a burst of connections.
 */
#include "berth.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <unistd.h>

/* The most this process's table was grown to: berth serve reserves before its store's
 * threads start and berth_host_new again, and the table never shrinks, so a call that
 * wants no more than that makes no system call beyond getrlimit. */
static _Atomic unsigned long reserved;

unsigned long berth_reserve_descriptors(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 0;
  unsigned long want = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > BERTH_RESERVED_DESCRIPTORS
                           ? BERTH_RESERVED_DESCRIPTORS : (unsigned long)rl.rlim_cur;
  if (want < 2)
    return 0;
  if (want <= atomic_load(&reserved))
    return want;
  /* A descriptor at want - 1 makes the kernel size the table for it; closed at once,
   * its slot stays: the table never shrinks. */
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, (int)(want - 1));
  close(fd);
  if (high < 0)
    return 0;
  close(high);
  unsigned long was = atomic_load(&reserved);
  while (was < want && !atomic_compare_exchange_weak(&reserved, &was, want))
    ;
  return want;
}

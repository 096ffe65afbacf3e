/* The heavy side of the asymmetric fences of fence.h, and their one-time
 * registration with the kernel. */
#include "common/fence.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

TP_TLS char tp__self_mark;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_once(void) {
  tp__hot.fence_expedited =
      syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
              0) == 0;
}

void tp__fence_init(void) {
  pthread_once(&once, init_once);
}

void tp__fence_heavy(void) {
  if (tp__hot.fence_expedited)
    (void)syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
  else
    atomic_thread_fence(memory_order_seq_cst);
}

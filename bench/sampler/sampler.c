/* A sampling profiler to preload into any process, for machines without
 * perf (the GPU machine has none): every SAMPLER_US microseconds of the
 * process's CPU time (default 1000), from SAMPLER_DELAY seconds after start
 * (default 0), a SIGPROF records the interrupted thread's stack through the
 * unwinder, which follows libcuda's frames too. At exit each sample is
 * written to SAMPLER_OUT.<pid> as one line of "library+offset" frames,
 * innermost first, for report.py to resolve against the binaries' symbols.
 *
 *   cc -O2 -shared -fPIC -o sampler.so bench/sampler/sampler.c -lpthread
 *   SAMPLER_OUT=/tmp/s LD_PRELOAD=$PWD/sampler.so python3 ...
 *   python3 bench/sampler/report.py /tmp/s.PID
 * libtidepool.so=build/libtidepool.so
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_SAMPLES 400000
#define MAX_FRAMES 24

static void *frames[MAX_SAMPLES][MAX_FRAMES];
static unsigned char depth[MAX_SAMPLES];
static atomic_uint taken;

static void on_prof(int sig, siginfo_t *info, void *uc) {
  (void)sig;
  (void)info;
  (void)uc;
  unsigned i = atomic_fetch_add(&taken, 1);
  if (i < MAX_SAMPLES)
    depth[i] = (unsigned char)backtrace(frames[i], MAX_FRAMES);
}

/* Starts the timer after the delay, on a thread of its own so that the
 * process's start (imports, say) goes unsampled. */
static void *start(void *arg) {
  (void)arg;
  const char *d = getenv("SAMPLER_DELAY");
  if (d)
    sleep((unsigned)atoi(d));
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, NULL);
  const char *u = getenv("SAMPLER_US");
  long us = u ? atol(u) : 1000;
  struct itimerval it = {{0, us}, {0, us}};
  setitimer(ITIMER_PROF, &it, NULL);
  return NULL;
}

__attribute__((constructor)) static void sampler_init(void) {
  if (!getenv("SAMPLER_OUT"))
    return;
  /* The unwinder loads on its first use, which a signal handler must not
   * be the one to make. */
  void *warm[4];
  backtrace(warm, 4);
  pthread_t t;
  if (pthread_create(&t, NULL, start, NULL) == 0)
    pthread_detach(t);
}

__attribute__((destructor)) static void sampler_fini(void) {
  const char *out = getenv("SAMPLER_OUT");
  if (!out)
    return;
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_PROF, &off, NULL);
  signal(SIGPROF, SIG_IGN);
  char path[512];
  snprintf(path, sizeof path, "%s.%d", out, (int)getpid());
  FILE *f = fopen(path, "w");
  if (!f)
    return;
  unsigned n = atomic_load(&taken);
  if (n > MAX_SAMPLES)
    n = MAX_SAMPLES;
  for (unsigned i = 0; i < n; i++) {
    /* Frame 0 is the handler, frame 1 the signal trampoline. */
    for (int k = 2; k < depth[i]; k++) {
      Dl_info di;
      if (dladdr(frames[i][k], &di) && di.dli_fname) {
        const char *base = strrchr(di.dli_fname, '/');
        fprintf(f, "%s+%lx ", base ? base + 1 : di.dli_fname,
                (unsigned long)((char *)frames[i][k] - (char *)di.dli_fbase));
      } else {
        fprintf(f, "?+%lx ", (unsigned long)(uintptr_t)frames[i][k]);
      }
    }
    fputc('\n', f);
  }
  fclose(f);
}

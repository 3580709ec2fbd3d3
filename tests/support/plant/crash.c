// SPDX-License-Identifier: Apache-2.0
// A planted failure (scripts/plant_failures.sh), LD_PRELOADed: a net conformance worker (argv[1] ==
// "conformance-worker") dies of SIGSEGV 150 ms after it starts (PLANT_CRASH_MS). RMA ranks are forked children of `weft conformance
// --rma`: with PLANT_RMA=1 every forked child dies of it 300 ms after the fork (one that execs first is not touched).
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void* killer(void* a) {
  const char* ms = getenv("PLANT_CRASH_MS");  // how long the process lives (default: the argument, in ms)
  usleep((useconds_t)(ms ? atol(ms) : (long)a) * 1000);
  raise(SIGSEGV);
  return 0;
}
static void child(void) { pthread_t t; pthread_create(&t, 0, killer, (void*)300L); pthread_detach(t); }
__attribute__((constructor)) static void init(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "conformance-worker") == 0) {
    pthread_t t; pthread_create(&t, 0, killer, (void*)150L); pthread_detach(t);
  }
  if (getenv("PLANT_RMA")) pthread_atfork(0, 0, child);
}

// SPDX-License-Identifier: Apache-2.0
// A planted failure (scripts/plant_failures.sh), LD_PRELOADed: in processes of `weft conformance` (net workers, RMA
// ranks), after PLANT_FLIP_AFTER (default 20) socket or file reads of 1 KiB or more, one byte of every 10th such
// read is flipped: data the plugin then hands on corrupted, or a header it must reject.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>
static int on = -1;
static long seen, after = 20;
static int active(void) {
  if (on < 0) {
    char buf[4096] = {0};
    on = 0;  // while reading, a nested read sees it off
    int fd = open("/proc/self/cmdline", O_RDONLY);
    long n = fd >= 0 ? syscall(SYS_read, fd, buf, sizeof buf - 1) : 0;
    if (fd >= 0) close(fd);
    const char* arg1 = n > 0 ? memchr(buf, 0, (size_t)n) : NULL;  // argv[1]: the weft subcommand
    on = arg1 != NULL && (strcmp(arg1 + 1, "conformance") == 0 || strcmp(arg1 + 1, "conformance-worker") == 0);
    if (getenv("PLANT_FLIP_AFTER")) after = atol(getenv("PLANT_FLIP_AFTER"));
  }
  return on;
}
static void maybe(unsigned char* p, ssize_t n) {
  if (n < 1024 || !active()) return;
  if (++seen > after && seen % 10 == 0) p[n / 2] ^= 0x5a;
}
// The same over a vector: the byte in the middle of what was read, in whichever buffer holds it.
static void maybev(const struct iovec* v, int c, ssize_t n) {
  if (n < 1024 || !active()) return;
  if (++seen <= after || seen % 10 != 0) return;
  size_t at = (size_t)n / 2;
  for (int i = 0; i < c; ++i) {
    if (at < v[i].iov_len) { ((unsigned char*)v[i].iov_base)[at] ^= 0x5a; return; }
    at -= v[i].iov_len;
  }
}
ssize_t recv(int fd, void* b, size_t l, int fl) {
  static ssize_t (*r)(int, void*, size_t, int);
  if (!r) r = dlsym(RTLD_NEXT, "recv");
  ssize_t n = r(fd, b, l, fl);
  if (!(fl & MSG_PEEK)) maybe(b, n);
  return n;
}
ssize_t read(int fd, void* b, size_t l) {
  static ssize_t (*r)(int, void*, size_t);
  if (!r) r = dlsym(RTLD_NEXT, "read");
  ssize_t n = r(fd, b, l);
  maybe(b, n);
  return n;
}
ssize_t recvmsg(int fd, struct msghdr* m, int fl) {
  static ssize_t (*r)(int, struct msghdr*, int);
  if (!r) r = dlsym(RTLD_NEXT, "recvmsg");
  ssize_t n = r(fd, m, fl);
  if (!(fl & MSG_PEEK)) maybev(m->msg_iov, (int)m->msg_iovlen, n);
  return n;
}
ssize_t readv(int fd, const struct iovec* v, int c) {
  static ssize_t (*r)(int, const struct iovec*, int);
  if (!r) r = dlsym(RTLD_NEXT, "readv");
  ssize_t n = r(fd, v, c);
  maybev(v, c, n);
  return n;
}

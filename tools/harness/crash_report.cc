// SPDX-License-Identifier: Apache-2.0
#include "crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace weft::harness {

namespace {

char gRole[64] = "a";
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

const char* signalName(int sig) {  // strsignal is not async-signal-safe
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGABRT: return "SIGABRT";
    default: return "signal";
  }
}

// Only async-signal-safe calls (write, backtrace after its first call, backtrace_symbols_fd): a crash inside
// malloc must not hang here.
void onCrash(int sig, siginfo_t* si, void* uc) {
  (void)uc;
  char line[256];
  const bool sent = si == nullptr || si->si_code <= 0;  // kill, raise or abort: no faulting address
  int n = sent ? std::snprintf(line, sizeof(line), "crash\t%s worker (pid %d): %s sent by pid %d; its stack:\n",
                               gRole, static_cast<int>(getpid()), signalName(sig), si != nullptr ? si->si_pid : 0)
               : std::snprintf(line, sizeof(line), "crash\t%s worker (pid %d): %s at %p; its stack:\n", gRole,
                               static_cast<int>(getpid()), signalName(sig), si->si_addr);
  if (n > 0) writeStderr(line, static_cast<size_t>(n) < sizeof(line) ? static_cast<size_t>(n) : sizeof(line) - 1);
  void* frames[64];
  const int depth = backtrace(frames, 64);
  for (int i = 1; i < depth; ++i) {  // frame 0 is this handler
    writeStderr("crash\t  ", 8);
    backtrace_symbols_fd(frames + i, 1, STDERR_FILENO);
  }
  // The default action, as if we had never been here: a fault happens again on return; an abort is raised again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (sig == SIGABRT || sent) raise(sig);  // not a fault of an instruction: returning would not repeat it
}

}  // namespace

void writeStderr(const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

struct sigaction faultAction(void (*handler)(int, siginfo_t*, void*)) {
  static const bool ready = [] {
    void* probe[1];
    backtrace(probe, 1);
    static char altStack[64 * 1024];
    stack_t ss{};
    ss.ss_sp = altStack;
    ss.ss_size = sizeof(altStack);
    sigaltstack(&ss, nullptr);
    return true;
  }();
  (void)ready;
  struct sigaction sa {};
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  return sa;
}

void installCrashReport(const char* role) {
  static bool done = false;
  if (done) return;
  done = true;
  std::snprintf(gRole, sizeof(gRole), "%s", role);
  const struct sigaction sa = faultAction(onCrash);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) sigaction(kSignals[i], &sa, nullptr);
}

}  // namespace weft::harness

// SPDX-License-Identifier: Apache-2.0
// A worker that crashes says where before it dies: its stack, as the C library can name it, on stderr, each line
// starting "crash\t" (so a log filter keeps them all: tests/rxe/guest_lib.sh). Then the signal's default action
// runs as it would have (a core dump where the system writes one). Frames of libraries without symbols for a
// function (weft's hidden ones, libfabric's static ones) read library(+offset): addr2line -e library offset.
#pragma once

#include <signal.h>

#include <cstddef>

namespace weft::harness {

// Once per process, before the plugin is loaded: SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT. role: "recv",
// "send", "rank 3" (copied).
void installCrashReport(const char* role);

// What a fault handler of the harness needs (this one and installDeviceFaultReport's): backtrace's library loaded
// now, not inside the handler; an alternate signal stack, so that a stack overflow still gets its report (once per
// process); and the action for `handler` (SA_SIGINFO, on that stack).
struct sigaction faultAction(void (*handler)(int, siginfo_t*, void*));

// All of s[0, n) to stderr with write(2) alone: async-signal-safe, for those handlers.
void writeStderr(const char* s, size_t n);

}  // namespace weft::harness

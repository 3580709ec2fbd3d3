// SPDX-License-Identifier: Apache-2.0
// Two worker processes of this executable, one per rank (receiver and sender), each optionally inside its own
// network namespace with its own environment, joined by a socketpair on fd 3 (NCCL's bootstrap, for them).
// Used by `weft conformance` and `weft bench`.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace weft::harness {

struct PairOptions {
  std::string self;  // this executable
  // The workers' working directory, DIR/recv and DIR/send: where a crash leaves its core dump when the kernel
  // writes dumps to the crashing process's directory (kernel.core_pattern without a '/'). Empty: build/dumps
  // beside this executable (<its dir>/../dumps). Worker flags that name files are made absolute first.
  std::string dumpDir;
  std::string recvNetns, sendNetns;
  // Each worker in a new PID namespace of its own (unshare --pid --fork --kill-child, inside its network namespace
  // if any): both can have the same process id, as in two containers that share /dev/shm.
  bool pidNs = false;
  std::vector<std::string> env, recvEnv, sendEnv;  // KEY=VALUE
};

struct WorkerProcess {
  pid_t pid = -1;
  int out = -1;  // its stdout
  std::string buffer;
  bool exited = false;
  int status = 0;
  std::string dir;  // its working directory
  // "exited with N", or "killed by signal N" and where its core dump went, if one was written.
  std::string describeExit() const;
};

// Starts `self <args...> --role recv|send --oob-fd 3` twice.
// Whether this machine lets us make PID namespaces (root, or unprivileged user namespaces); *why says why not.
bool pidNamespacesWork(std::string* why);

void spawnPair(const PairOptions& o, const std::vector<std::string>& args, WorkerProcess workers[2]);

// Reads both workers' output line by line until both exit or `deadline` passes (then kills them and returns
// false). onLine(workerIndex, line) sees every complete line.
bool collectPair(WorkerProcess workers[2], std::chrono::steady_clock::time_point deadline,
                 const std::function<void(int, const std::string&)>& onLine);

}  // namespace weft::harness

// SPDX-License-Identifier: Apache-2.0
// The live view `weft inspect` reads (docs/hangs.md): a local socket per weft process,
// WEFT_INSPECT_DIR/<pid>-<pid namespace>.sock (default /tmp/weft-<uid>), that answers each connection with a dump
// of the process's weft connections and closes; at its start it removes the sockets of dead processes of its PID
// namespace (killed ones could not).
//
// Only the job's user can read it: the folder is this user's and no one else's (made 0700; one with other owners or
// wider permissions is refused with a warning, and nothing is served), the socket is 0600, and a client whose
// SO_PEERCRED uid is another's is closed unanswered. Nothing listens on the network. The thread it runs on sleeps
// in poll() and wakes only for a client or for shutdown; a forked child (a data-loader worker) does not serve.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace weft::telemetry {

class InspectServer {
 public:
  // Starts serving `dump` (called on the server's thread for each client) unless WEFT_INSPECT is off or the folder
  // is unsafe; says why not at INFO or WARN. nullptr when it does not serve. With `onTerm` (and WEFT_DUMP_ON_TERM),
  // a SIGTERM handler: the signal wakes the server's thread, which calls onTerm (for at most kTermWaitMs), then
  // the process does what the signal would have done without weft (the handler before weft's, or the default).
  static std::unique_ptr<InspectServer> start(std::function<std::string()> dump,
                                              std::function<void()> onTerm = nullptr);
  static constexpr int kTermWaitMs = 2000;
  ~InspectServer();  // stops the thread, removes the socket file
  InspectServer(const InspectServer&) = delete;
  InspectServer& operator=(const InspectServer&) = delete;
  const std::string& path() const { return path_; }

 private:
  InspectServer() = default;
  void run();
  std::function<std::string()> dump_;
  std::function<void()> onTerm_;
  bool termInstalled_ = false;
  std::string path_;
  int listenFd_ = -1;
  int stopFd_ = -1;  // an eventfd the destructor writes
  int termFd_ = -1;  // an eventfd the SIGTERM handler writes
  struct Thread;
  std::unique_ptr<Thread> thread_;
};

// The folder the sockets are in: WEFT_INSPECT_DIR, or /tmp/weft-<uid>.
std::string inspectDir();
// A socket's file name, "<pid>-<pid namespace>.sock" (a sweep of dead processes' sockets touches only its own
// namespace's), and back: false for another name.
std::string socketName(int pid, uint64_t ns);
bool parseSocketName(const std::string& name, int* pid, uint64_t* ns);

}  // namespace weft::telemetry

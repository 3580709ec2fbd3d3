// SPDX-License-Identifier: Apache-2.0
#include "process_pair.h"

#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace weft::harness {

namespace {

// Where the kernel put a dump of a process that ran in `dir`, in words.
std::string whereDumped(const std::string& dir) {
  std::string pattern;
  std::ifstream("/proc/sys/kernel/core_pattern") >> pattern;
  rlimit core{};
  if (getrlimit(RLIMIT_CORE, &core) == 0 && core.rlim_cur == 0) return "no core dump (ulimit -c is 0)";
  if (pattern.empty()) return "core dump: unknown (kernel.core_pattern unreadable)";
  if (pattern[0] == '|') return "core dump, if written, handed to " + pattern.substr(1, pattern.find(' ') - 1);
  if (pattern.find('/') != std::string::npos) return "core dump, if written, per kernel.core_pattern " + pattern;
  return "core dump, if written, in " + dir + " (kernel.core_pattern " + pattern + ")";
}

}  // namespace

std::string WorkerProcess::describeExit() const {
  if (WIFSIGNALED(status)) {
    std::string s = "killed by signal " + std::to_string(WTERMSIG(status));
    if (WCOREDUMP(status)) s += "; " + whereDumped(dir.empty() ? "its working directory" : dir);
    return s;
  }
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

namespace {

std::string absolute(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::absolute(path, ec);
  return ec ? path : p.string();
}

// The workers' directory: the one asked for, or <dir of this executable>/../dumps; created. Empty where it cannot
// be made (the workers then stay in ours, and say so).
std::string dumpRoot(const PairOptions& o) {
  std::string root = o.dumpDir;
  if (root.empty()) {
    size_t slash = o.self.rfind('/');
    root = (slash == std::string::npos ? std::string(".") : o.self.substr(0, slash)) + "/../dumps";
  }
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) {
    std::fprintf(stderr, "weft: cannot make the workers' directory %s (%s); they run in this one\n", root.c_str(),
                 ec.message().c_str());
    return "";
  }
  return std::filesystem::weakly_canonical(root, ec).string();
}

WorkerProcess spawnOne(const PairOptions& o, const std::vector<std::string>& workerArgs, const char* role, int oobFd,
                       const std::string& netns, const std::vector<std::string>& extraEnv, const std::string& root) {
  std::string dir;
  if (!root.empty()) {
    dir = root + "/" + role;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) dir.clear();
  }
  int pipefd[2];
  if (pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> args;
  if (!netns.empty()) args = {"ip", "netns", "exec", netns};
  // --kill-child: the worker (pid 1 of its namespace) dies with the unshare process the harness kills and reaps.
  if (o.pidNs) args.insert(args.end(), {"unshare", "--pid", "--fork", "--kill-child"});
  args.push_back(absolute(o.self));
  // The worker runs elsewhere: the files its flags name are found from here.
  for (size_t i = 0; i < workerArgs.size(); ++i) {
    // A plugin named without a '/' ("weft", "libnccl-net-weft.so") is the loader's to find, as NCCL leaves it.
    bool isPath = i > 0 && ((workerArgs[i - 1] == "--plugin" && workerArgs[i].find('/') != std::string::npos) ||
                            workerArgs[i - 1] == "--trace-dir");
    args.push_back(isPath && !dir.empty() ? absolute(workerArgs[i]) : workerArgs[i]);
  }
  for (const char* a : {"--role", role, "--oob-fd", "3"}) args.push_back(a);
  // Relative entries of the library path would be read from the worker's directory: made absolute from here.
  std::string libPath;
  if (const char* lp = std::getenv("LD_LIBRARY_PATH"); lp != nullptr && !dir.empty()) {
    std::string rest = lp;
    for (size_t at = 0; at <= rest.size();) {
      size_t colon = rest.find(':', at);
      std::string part = rest.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
      if (!libPath.empty()) libPath += ':';
      libPath += part.empty() || part[0] == '/' ? part : absolute(part);
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
  }
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(oobFd, 3);
    for (int fd = 4; fd < 1024; ++fd) close(fd);
    // Debian's libfabric pulls in libinfinipath (the psm provider), whose SIGSEGV handler prints a backtrace and
    // exits with 1: a crash would read as a failure with no dump. Its own switch turns the handler off.
    setenv("IPATH_NO_BACKTRACE", "1", 0);
    if (!libPath.empty()) setenv("LD_LIBRARY_PATH", libPath.c_str(), 1);
    for (const auto& kv : o.env) putenv(strdup(kv.c_str()));
    for (const auto& kv : extraEnv) putenv(strdup(kv.c_str()));
    if (!dir.empty() && chdir(dir.c_str()) != 0) {
      std::fprintf(stderr, "cannot enter %s: %s\n", dir.c_str(), std::strerror(errno));
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot start %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  close(pipefd[1]);
  WorkerProcess w;
  w.pid = pid;
  w.out = pipefd[0];
  w.dir = dir;
  return w;
}

}  // namespace

bool pidNamespacesWork(std::string* why) {
  pid_t pid = fork();
  if (pid < 0) {
    *why = "fork failed";
    return false;
  }
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) dup2(devnull, 2), dup2(devnull, 1);
    execlp("unshare", "unshare", "--pid", "--fork", "--kill-child", "true", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  *why = WIFEXITED(status) && WEXITSTATUS(status) == 127 ? "no unshare command (util-linux)"
                                                           : "unshare --pid failed (it needs root here)";
  return false;
}

void spawnPair(const PairOptions& o, const std::vector<std::string>& args, WorkerProcess workers[2]) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) throw std::runtime_error("socketpair failed");
  signal(SIGPIPE, SIG_IGN);
  std::string root = dumpRoot(o);
  workers[0] = spawnOne(o, args, "recv", sv[0], o.recvNetns, o.recvEnv, root);
  workers[1] = spawnOne(o, args, "send", sv[1], o.sendNetns, o.sendEnv, root);
  close(sv[0]);
  close(sv[1]);
}

bool collectPair(WorkerProcess workers[2], std::chrono::steady_clock::time_point deadline,
                 const std::function<void(int, const std::string&)>& onLine) {
  while (!(workers[0].exited && workers[1].exited)) {
    pollfd fds[2];
    int nfds = 0;
    for (int i = 0; i < 2; ++i) {
      if (workers[i].out >= 0) fds[nfds++] = pollfd{workers[i].out, POLLIN, 0};
    }
    if (nfds > 0) poll(fds, nfds, 200);
    for (int i = 0; i < 2; ++i) {
      WorkerProcess& w = workers[i];
      if (w.out < 0) continue;
      pollfd p{w.out, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        char buf[4096];
        ssize_t n = read(w.out, buf, sizeof(buf));
        if (n > 0) {
          w.buffer.append(buf, n);
          size_t nl;
          while ((nl = w.buffer.find('\n')) != std::string::npos) {
            onLine(i, w.buffer.substr(0, nl));
            w.buffer.erase(0, nl + 1);
          }
        } else {
          close(w.out);
          w.out = -1;
        }
      }
      if (!w.exited && w.out < 0 && waitpid(w.pid, &w.status, 0) == w.pid) w.exited = true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int i = 0; i < 2; ++i) {
        if (!workers[i].exited) {
          kill(workers[i].pid, SIGKILL);
          waitpid(workers[i].pid, &workers[i].status, 0);
          workers[i].exited = true;
        }
      }
      return false;
    }
  }
  return true;
}

}  // namespace weft::harness

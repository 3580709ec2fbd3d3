#include "process_pair.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace weft::harness {

std::string WorkerProcess::describeExit() const {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with " + std::to_string(WEXITSTATUS(status));
}

namespace {

WorkerProcess spawnOne(const PairOptions& o, const std::vector<std::string>& workerArgs, const char* role, int oobFd,
                       const std::string& netns, const std::vector<std::string>& extraEnv) {
  int pipefd[2];
  if (pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> args;
  if (!netns.empty()) args = {"ip", "netns", "exec", netns};
  args.push_back(o.self);
  args.insert(args.end(), workerArgs.begin(), workerArgs.end());
  for (const char* a : {"--role", role, "--oob-fd", "3"}) args.push_back(a);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(oobFd, 3);
    for (int fd = 4; fd < 1024; ++fd) close(fd);
    for (const auto& kv : o.env) putenv(strdup(kv.c_str()));
    for (const auto& kv : extraEnv) putenv(strdup(kv.c_str()));
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
  return w;
}

}  // namespace

void spawnPair(const PairOptions& o, const std::vector<std::string>& args, WorkerProcess workers[2]) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) throw std::runtime_error("socketpair failed");
  signal(SIGPIPE, SIG_IGN);
  workers[0] = spawnOne(o, args, "recv", sv[0], o.recvNetns, o.recvEnv);
  workers[1] = spawnOne(o, args, "send", sv[1], o.sendNetns, o.sendEnv);
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

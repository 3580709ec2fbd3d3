// SPDX-License-Identifier: Apache-2.0
// The `weft inspect` socket of a weft process (inspect.h).
#include "telemetry/inspect.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/common/process.h"

namespace weft::telemetry {

struct InspectServer::Thread {
  std::thread t;
};

std::string socketName(int pid, uint64_t ns) { return fmt::format("{}-{}.sock", pid, ns); }

bool parseSocketName(const std::string& name, int* pid, uint64_t* ns) {
  if (name.size() < 8 || name.compare(name.size() - 5, 5, ".sock") != 0) return false;
  char* end = nullptr;
  const long p = std::strtol(name.c_str(), &end, 10);
  if (p <= 0 || *end != '-') return false;
  const char* nsAt = end + 1;
  const unsigned long long n = std::strtoull(nsAt, &end, 10);
  if (end == nsAt || end != name.c_str() + name.size() - 5) return false;
  *pid = static_cast<int>(p);
  *ns = n;
  return true;
}

std::string inspectDir() {
  const std::string d = params::getString("WEFT_INSPECT_DIR");
  return d.empty() ? fmt::format("/tmp/weft-{}", getuid()) : d;
}

namespace {

constexpr int kSendBoundSec = 2;  // how long one answer may wait on a client that does not read

// The SIGTERM handler's state: plain values and lock-free atomics only (a handler may touch nothing else).
std::atomic<int> gTermFd{-1};       // the server's eventfd; -1: no server to wake
std::atomic<int> gTermOwner{0};     // the pid that installed it (a forked child has no server thread)
std::atomic<int> gTermState{0};     // 0 idle, 1 asked, 2 the dump is written
struct sigaction gTermBefore {};    // what SIGTERM did before weft's handler

void sleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void termHandler(int sig, siginfo_t* info, void* uctx) {
  const int saved = errno;
  const int fd = gTermFd.load();
  int idle = 0;
  if (fd >= 0 && gTermOwner.load() == ::getpid() && gTermState.compare_exchange_strong(idle, 1)) {
    const uint64_t one = 1;
    (void)!::write(fd, &one, sizeof(one));
    for (int waited = 0; waited < InspectServer::kTermWaitMs && gTermState.load() != 2; waited += 10) sleepMs(10);
  }
  // What the signal would have done without weft.
  if ((gTermBefore.sa_flags & SA_SIGINFO) != 0 && gTermBefore.sa_sigaction != nullptr) {
    gTermBefore.sa_sigaction(sig, info, uctx);
  } else if (gTermBefore.sa_handler == SIG_IGN) {
    // ignored before: still ignored
  } else if (gTermBefore.sa_handler == SIG_DFL || gTermBefore.sa_handler == nullptr) {
    ::sigaction(SIGTERM, &gTermBefore, nullptr);  // the default again; delivered as this handler returns
    ::raise(SIGTERM);
  } else {
    gTermBefore.sa_handler(sig);
  }
  errno = saved;
}

// The folder exists (made 0700 if not), is a folder, is this user's and no one else can enter it: "" or why not.
std::string safeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return fmt::format("cannot make it: {}", std::strerror(errno));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return fmt::format("cannot read it: {}", std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "it is not a folder (a link or a file)";
  if (st.st_uid != getuid()) return fmt::format("it belongs to uid {}, not to this user ({})", st.st_uid, getuid());
  if ((st.st_mode & 077) != 0) return fmt::format("others may use it (mode {:o}; 700 expected)", st.st_mode & 0777);
  return {};
}

// Sockets of processes of this PID namespace that are gone (killed: they could not remove theirs).
void sweepDead(const std::string& dir, uint64_t ns) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    int pid = 0;
    uint64_t theirs = 0;
    if (!parseSocketName(e->d_name, &pid, &theirs) || theirs != ns || pid == getpid()) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

void writeAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // the client went away
    off += static_cast<size_t>(w);
  }
}

}  // namespace

std::unique_ptr<InspectServer> InspectServer::start(std::function<std::string()> dump, std::function<void()> onTerm) {
  if (!params::getBool("WEFT_INSPECT")) return nullptr;
  const std::string dir = inspectDir();
  if (std::string why = safeDir(dir); !why.empty()) {
    WEFT_WARN("weft inspect: not serving this process: the folder {} is unsafe ({}); WEFT_INSPECT_DIR names another",
              dir, why);
    return nullptr;
  }
  auto s = std::unique_ptr<InspectServer>(new InspectServer());
  s->dump_ = std::move(dump);
  const uint64_t ns = pidNamespace();
  sweepDead(dir, ns);
  s->path_ = fmt::format("{}/{}", dir, socketName(getpid(), ns));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (s->path_.size() >= sizeof(addr.sun_path)) {
    WEFT_WARN("weft inspect: not serving this process: {} is longer than a socket path may be", s->path_);
    return nullptr;
  }
  std::memcpy(addr.sun_path, s->path_.c_str(), s->path_.size() + 1);
  s->listenFd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  s->stopFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->listenFd_ < 0 || s->stopFd_ < 0) {
    WEFT_WARN("weft inspect: not serving this process: {}", std::strerror(errno));
    return nullptr;  // the destructor closes what was opened
  }
  ::unlink(s->path_.c_str());  // a file of an earlier process with this pid (it is gone: pids are not shared)
  const mode_t old = ::umask(0177);  // the socket file 0600 from its creation
  const int rc = ::bind(s->listenFd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  ::umask(old);
  if (rc != 0 || ::listen(s->listenFd_, 8) != 0) {
    WEFT_WARN("weft inspect: not serving this process: {}: {}", s->path_, std::strerror(errno));
    ::unlink(s->path_.c_str());
    s->path_.clear();
    return nullptr;
  }
  if (onTerm && params::getBool("WEFT_DUMP_ON_TERM")) {
    s->termFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->onTerm_ = std::move(onTerm);
  }
  // The server's thread never takes SIGTERM (its handler waits for this thread).
  sigset_t term, mask;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &mask);
  s->thread_ = std::make_unique<Thread>();
  s->thread_->t = std::thread([p = s.get()] { p->run(); });
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  if (s->termFd_ >= 0 && gTermFd.load() < 0) {
    struct sigaction mine {};
    mine.sa_sigaction = termHandler;
    mine.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&mine.sa_mask);
    gTermState.store(0);
    gTermOwner.store(::getpid());
    gTermFd.store(s->termFd_);
    if (::sigaction(SIGTERM, &mine, &gTermBefore) == 0) {
      s->termInstalled_ = true;
    } else {
      gTermFd.store(-1);
    }
  }
  WEFT_INFO(NCCL_INIT, "weft inspect: this process answers at {}{}", s->path_,
            s->termInstalled_ ? "; a SIGTERM writes its dump first" : "");
  return s;
}

InspectServer::~InspectServer() {
  if (termInstalled_) {
    // Put back what SIGTERM did before, unless the application has installed its own since.
    struct sigaction now {};
    if (::sigaction(SIGTERM, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) != 0 &&
        now.sa_sigaction == termHandler) {
      ::sigaction(SIGTERM, &gTermBefore, nullptr);
    }
    gTermFd.store(-1);
  }
  if (thread_ && thread_->t.joinable()) {
    const uint64_t one = 1;
    (void)!::write(stopFd_, &one, sizeof(one));
    thread_->t.join();
  }
  if (listenFd_ >= 0) ::close(listenFd_);
  if (stopFd_ >= 0) ::close(stopFd_);
  if (termFd_ >= 0) ::close(termFd_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

void InspectServer::run() {
  for (;;) {
    pollfd p[3] = {{listenFd_, POLLIN, 0}, {stopFd_, POLLIN, 0}, {termFd_, POLLIN, 0}};
    if (::poll(p, termFd_ >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if ((p[1].revents & POLLIN) != 0) return;
    if (termFd_ >= 0 && (p[2].revents & POLLIN) != 0) {
      uint64_t n = 0;
      (void)!::read(termFd_, &n, sizeof(n));
      try {
        onTerm_();
      } catch (...) {
      }
      gTermState.store(2);
      continue;
    }
    if ((p[0].revents & POLLIN) == 0) continue;
    const int c = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    // A client that connects and never reads must not hold this thread (nor the process's exit, which joins it).
    const timeval bound{kSendBoundSec, 0};
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof(bound));
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == getuid()) {
      std::string out;
      try {
        out = dump_();
      } catch (const std::exception& e) {
        out = fmt::format("{{\"type\":\"error\",\"what\":\"{}\"}}\n", e.what());
      }
      writeAll(c, out);
    }
    ::close(c);
  }
}

}  // namespace weft::telemetry

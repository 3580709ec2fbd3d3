#include "runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "check_support.h"
#include "checks.h"

namespace weft::harness {
namespace {

bool selected(const std::string& name, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const auto& o : only) {
    if (name == o || name.rfind(o, 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string oneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return s;
}

struct Worker {
  pid_t pid = -1;
  int out = -1;  // its stdout
  std::string buffer;
  std::map<std::string, std::pair<std::string, std::string>> results;  // check -> (verdict, message)
  std::vector<std::string> info;
  bool exited = false;
  int status = 0;
};

void consumeLines(Worker& w) {
  size_t nl;
  while ((nl = w.buffer.find('\n')) != std::string::npos) {
    std::string line = w.buffer.substr(0, nl);
    w.buffer.erase(0, nl + 1);
    auto f = split(line, '\t');
    if (f.size() >= 3 && f[0] == "RESULT") {
      w.results[f[1]] = {f[2], f.size() > 3 ? f[3] : ""};
    } else if (f.size() >= 2 && f[0] == "INFO") {
      w.info.push_back(line.substr(5));
    }
  }
}

Worker spawn(const RunOptions& o, const char* role, int oobFd, const std::vector<std::string>& checks,
             const std::string& netns, const std::vector<std::string>& extraEnv) {
  int pipefd[2];
  if (pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> args;
  if (!netns.empty()) args = {"ip", "netns", "exec", netns};
  std::string names;
  for (const auto& c : checks) names += (names.empty() ? "" : ",") + c;
  std::vector<std::string> tail = {o.self, "conformance-worker", "--plugin", o.plugin, "--table",
                                   std::to_string(o.version), "--role", role, "--oob-fd", "3", "--dev",
                                   std::to_string(o.dev < 0 ? 0 : o.dev), "--timeout", std::to_string(o.timeoutSec),
                                   "--checks", names};
  if (o.quick) tail.push_back("--quick");
  if (o.verbose) tail.push_back("--verbose");
  args.insert(args.end(), tail.begin(), tail.end());
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
  Worker w;
  w.pid = pid;
  w.out = pipefd[0];
  return w;
}

}  // namespace

int listChecks() {
  for (const auto& c : allChecks()) std::printf("%-30s %s\n", c.name.c_str(), c.what.c_str());
  return 0;
}

int runConformance(const RunOptions& o) {
  std::string error;
  auto plugin = LoadedPlugin::open(o.plugin, o.version, &error);
  if (!plugin) {
    std::fprintf(stderr, "weft conformance: %s\n", error.c_str());
    return 2;
  }
  std::string versions;
  for (int v : plugin->exported()) versions += (versions.empty() ? "v" : ", v") + std::to_string(v);
  std::printf("plugin  %s\nname    %s\ntables  %s; testing v%d\n", o.plugin.c_str(), plugin->api().name(),
              versions.c_str(), plugin->api().version());
  RunOptions opts = o;
  opts.version = plugin->api().version();
  plugin.reset();

  std::vector<std::string> checks, excluded;
  for (const auto& c : allChecks()) {
    if (!selected(c.name, o.only)) continue;
    if (!o.skip.empty() && selected(c.name, o.skip)) {
      excluded.push_back(c.name);
    } else {
      checks.push_back(c.name);
    }
  }
  if (checks.empty()) {
    std::fprintf(stderr, "weft conformance: no check matches the selection\n");
    return 2;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    std::perror("socketpair");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  Worker workers[2] = {spawn(opts, "recv", sv[0], checks, o.recvNetns, o.recvEnv),
                       spawn(opts, "send", sv[1], checks, o.sendNetns, o.sendEnv)};
  close(sv[0]);
  close(sv[1]);

  // Each check is bounded inside the workers; this bound catches a worker stuck inside a plugin call.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60 + checks.size() * (o.timeoutSec + 15));
  while (!(workers[0].exited && workers[1].exited)) {
    pollfd fds[2];
    int nfds = 0;
    for (auto& w : workers) {
      if (w.out >= 0) fds[nfds++] = pollfd{w.out, POLLIN, 0};
    }
    if (nfds > 0) poll(fds, nfds, 200);
    for (auto& w : workers) {
      if (w.out < 0) continue;
      pollfd p{w.out, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        char buf[4096];
        ssize_t n = read(w.out, buf, sizeof(buf));
        if (n > 0) {
          w.buffer.append(buf, n);
          consumeLines(w);
        } else {
          close(w.out);
          w.out = -1;
        }
      }
    }
    for (auto& w : workers) {
      if (!w.exited && w.out < 0 && waitpid(w.pid, &w.status, 0) == w.pid) w.exited = true;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& w : workers) {
        if (!w.exited) {
          kill(w.pid, SIGKILL);
          waitpid(w.pid, &w.status, 0);
          w.exited = true;
        }
      }
      std::printf("the workers exceeded the overall time limit and were killed (a plugin call hung)\n");
    }
  }
  for (const auto& line : workers[0].info) std::printf("recv    %s\n", line.c_str());
  for (const auto& line : workers[1].info) std::printf("send    %s\n", line.c_str());

  int passed = 0, failed = 0, skipped = 0;
  const char* roles[2] = {"recv", "send"};
  for (const auto& name : checks) {
    std::string verdict = "PASS", detail;
    bool anySkip = false;
    for (int i = 0; i < 2; ++i) {
      auto it = workers[i].results.find(name);
      if (it == workers[i].results.end()) {
        verdict = "FAIL";
        int st = workers[i].status;
        detail += std::string(detail.empty() ? "" : "; ") + "[" + roles[i] + "] no verdict: worker " +
                  (WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                                   : "exited with " + std::to_string(WEXITSTATUS(st)));
        continue;
      }
      if (it->second.first == "FAIL") {
        verdict = "FAIL";
        detail += std::string(detail.empty() ? "" : "; ") + "[" + roles[i] + "] " + it->second.second;
      } else if (it->second.first == "SKIP") {
        anySkip = true;
        if (verdict == "PASS" && detail.empty()) detail = it->second.second;
      }
    }
    if (verdict == "PASS" && anySkip) verdict = "SKIP";
    if (verdict == "PASS") detail.clear();
    std::printf("[%s] %-30s %s\n", verdict.c_str(), name.c_str(), detail.c_str());
    (verdict == "PASS" ? passed : verdict == "FAIL" ? failed : skipped)++;
  }
  for (const auto& name : excluded) {
    std::printf("[SKIP] %-30s excluded on the command line\n", name.c_str());
    ++skipped;
  }
  std::printf("conformance: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

int runWorker(int argc, char** argv) {
  std::string pluginPath, roleName, checkList;
  int version = 0, oobFd = -1, dev = 0, timeoutSec = 60;
  bool quick = false, verbose = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--plugin") pluginPath = next();
    else if (a == "--table") version = std::atoi(next().c_str());
    else if (a == "--role") roleName = next();
    else if (a == "--oob-fd") oobFd = std::atoi(next().c_str());
    else if (a == "--dev") dev = std::atoi(next().c_str());
    else if (a == "--timeout") timeoutSec = std::atoi(next().c_str());
    else if (a == "--checks") checkList = next();
    else if (a == "--quick") quick = true;
    else if (a == "--verbose") verbose = true;
  }
  setVerbose(verbose);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Oob oob(oobFd);
  std::string error;
  auto plugin = LoadedPlugin::open(pluginPath, version, &error);
  auto report = [](const std::string& name, const char* verdict, const std::string& msg) {
    std::printf("RESULT\t%s\t%s\t%s\n", name.c_str(), verdict, oneLine(msg).c_str());
    std::fflush(stdout);
  };
  std::vector<std::string> names = split(checkList, ',');
  if (!plugin) {
    for (const auto& n : names) report(n, "FAIL", error);
    return 2;
  }
  NetApi& net = plugin->api();
  CheckEnv env{roleName == "recv" ? Role::kRecv : Role::kSend, net, oob};
  env.dev = dev;
  env.quick = quick;
  env.timeout = std::chrono::seconds(timeoutSec);
  env.isWeft = std::string(net.name()) == "weft";
  std::string setupError;
  int ndev = 0;
  ncclResult_t r = net.init(&env.ctx, 0xC0FFEE);
  if (r != ncclSuccess) setupError = std::string("init returned ") + resultName(r);
  if (setupError.empty() && ((r = net.devices(&ndev)) != ncclSuccess || ndev <= 0)) {
    setupError = "the plugin offers no device (devices() = " + std::to_string(ndev) + ", " + resultName(r) +
                 ")" + (warningCount() ? ": " + lastWarning() : "");
  }
  if (setupError.empty() && dev >= ndev) setupError = "device " + std::to_string(dev) + " does not exist";
  if (setupError.empty() && (r = net.getProperties(dev, &env.props)) != ncclSuccess) {
    setupError = std::string("getProperties returned ") + resultName(r);
  }
  if (!setupError.empty()) {
    for (const auto& n : names) report(n, "FAIL", setupError);
    return 2;
  }
  std::printf("INFO\tdevice %d of %d: %s (speed %d Mb/s, maxRecvs %d, ptrSupport %#x%s%s)\n", dev, ndev,
              env.props.name.c_str(), env.props.speed, env.props.maxRecvs, env.props.ptrSupport,
              env.props.pciPath.empty() ? "" : ", pci ", env.props.pciPath.c_str());
  for (const auto& name : names) {
    const Check* check = nullptr;
    for (const auto& c : allChecks()) {
      if (c.name == name) check = &c;
    }
    if (check == nullptr) continue;
    try {
      oob.barrier("begin:" + name, std::chrono::seconds(timeoutSec + 30));
    } catch (const std::exception& e) {
      report(name, "FAIL", std::string("could not start in step with the peer: ") + e.what());
      return 1;
    }
    std::string verdict = "PASS", msg;
    try {
      check->run(env);
    } catch (const CheckSkip& e) {
      verdict = "SKIP";
      msg = e.what();
    } catch (const PeerAborted& e) {
      verdict = "FAIL";
      msg = e.what();
    } catch (const std::exception& e) {
      verdict = "FAIL";
      msg = e.what();
    }
    // Exchange verdicts so a side still waiting inside the check stops (it sees the verdict and aborts).
    try {
      oob.send("verdict:" + name + ":" + verdict);
      while (oob.lastVerdict().rfind("verdict:" + name + ":", 0) != 0) {
        oob.recvString(std::chrono::seconds(timeoutSec + 30));  // anything else is left over from this check
      }
      oob.discardPending();
    } catch (const std::exception& e) {
      report(name, verdict == "PASS" ? "FAIL" : verdict.c_str(), msg + (msg.empty() ? "" : "; ") + e.what());
      return 1;
    }
    report(name, verdict.c_str(), msg);
  }
  if (net.hasFinalize()) net.finalize(env.ctx);
  return 0;
}

}  // namespace weft::harness

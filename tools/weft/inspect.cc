// SPDX-License-Identifier: Apache-2.0
// weft inspect: the live view of every weft process of this user on this host (docs/hangs.md). Each process answers
// on its socket (src/telemetry/inspect.h) with JSON lines; this prints them, or passes them on (--json). Sockets of
// processes that are gone are removed.
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "args.h"
#include "telemetry/inspect.h"
#include "weft/common/process.h"

namespace weft::tool {
namespace {

// Connects to one socket and reads its answer (bounded by `timeoutMs`): false with *why when it does not answer.
bool ask(const std::string& path, int timeoutMs, std::string* out, std::string* why) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    *why = "path too long";
    return false;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::strerror(errno);
    return false;
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    *why = std::strerror(errno);
    ::close(fd);
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *why = "no answer within " + std::to_string(timeoutMs) + " ms (the process may hold its lock: hung inside weft?)";
      ::close(fd);
      return false;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

std::string num(double v) {
  char b[32];
  if (v >= 1e9) std::snprintf(b, sizeof(b), "%.1fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(b, sizeof(b), "%.1fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(b, sizeof(b), "%.1fk", v / 1e3);
  else std::snprintf(b, sizeof(b), "%.0f", v);
  return b;
}

// One process's answer as text: its line, its communicators, its connections (stalled ones first).
void print(const std::string& answer) {
  std::vector<nlohmann::json> conns;
  size_t at = 0;
  while (at < answer.size()) {
    size_t nl = answer.find('\n', at);
    if (nl == std::string::npos) nl = answer.size();
    const nlohmann::json j = nlohmann::json::parse(answer.substr(at, nl - at), nullptr, false);
    at = nl + 1;
    if (j.is_discarded() || !j.is_object()) continue;
    const std::string type = j.value("type", "");
    if (type == "process") {
      std::printf("%s:%d  %d weft connections, %d NCCL communicators\n", j.value("host", "?").c_str(),
                  j.value("pid", 0), j.value("conns", 0), j.value("comms", 0));
    } else if (type == "comm") {
      std::printf("  communicator %s %s rank %d of %d (%d nodes)\n", j.value("comm", "").c_str(),
                  j.value("comm_name", "").c_str(), j.value("rank", -1), j.value("nranks", 0), j.value("nnodes", 0));
    } else if (type == "conn") {
      conns.push_back(j);
    } else if (type == "error") {
      std::printf("  error: %s\n", j.value("what", "").c_str());
    }
  }
  std::stable_sort(conns.begin(), conns.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value("stalled_s", 0.0) > b.value("stalled_s", 0.0);
  });
  if (conns.empty()) return;
  std::printf("  %5s %-4s %-28s %-14s %8s %8s %9s %6s %8s %9s  %s\n", "conn", "dir", "peer", "nic", "msgs",
              "bytes", "p50 us", "stalls", "inflight", "oldest s", "now");
  for (const auto& c : conns) {
    const double stalled = c.value("stalled_s", 0.0);
    const std::string now = stalled > 0 ? "STALLED " + std::to_string(static_cast<long>(stalled)) + " s" : "moving";
    // The device API's lines name the peer by its rank too.
    const std::string peer = c.value("dir", "") == "rma" ? c.value("peer_name", "") : c.value("peer", "");
    std::printf("  %5d %-4s %-28s %-14s %8s %8s %9.1f %6llu %8d %9.1f  %s\n", c.value("conn", 0),
                c.value("dir", "").c_str(), peer.c_str(), c.value("device", "").c_str(),
                num(c.value("msgs", 0.0)).c_str(), num(c.value("bytes", 0.0)).c_str(), c.value("lat_p50_us", 0.0),
                static_cast<unsigned long long>(c.value("stalls", uint64_t{0})), c.value("inflight", 0),
                c.value("oldest_s", 0.0), now.c_str());
    // The operations in flight, oldest first (at most 4 here; --json has them all).
    const auto ops = c.value("ops", nlohmann::json::array());
    for (size_t i = 0; i < ops.size() && i < 4; ++i) {
      if (ops[i].contains("op")) {  // the device API's: put, get, signal, with the bytes moved so far
        std::printf("        %s of %s bytes, %s moved, posted %.1f s ago\n", ops[i].value("op", "").c_str(),
                    num(ops[i].value("bytes", 0.0)).c_str(), num(ops[i].value("done", 0.0)).c_str(),
                    ops[i].value("age_s", 0.0));
        continue;
      }
      std::printf("        op tag %d, %s bytes in %u buffer%s, posted %.1f s ago\n", ops[i].value("tag", 0),
                  num(ops[i].value("bytes", 0.0)).c_str(), ops[i].value("bufs", 1u),
                  ops[i].value("bufs", 1u) == 1 ? "" : "s", ops[i].value("age_s", 0.0));
    }
    if (ops.size() > 4) std::printf("        ... and %zu more\n", ops.size() - 4);
  }
}

}  // namespace

int inspectCommand(int argc, char** argv) {
  bool json = false;
  int onlyPid = 0;
  std::string dir;
  harness::Args a("inspect", argc, argv, 2);
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--json") json = true;
    else if (f == "--pid") onlyPid = a.number(1, 1 << 22);
    else if (f == "--dir") dir = a.value();
    else a.unknown();
  }
  if (dir.empty()) dir = telemetry::inspectDir();
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    std::printf("weft inspect: no weft process of this user answers here (%s: %s)\n", dir.c_str(), std::strerror(errno));
    return 0;
  }
  struct Sock {
    int pid;
    uint64_t ns;
    std::string path;
    bool operator<(const Sock& o) const { return pid < o.pid; }
  };
  std::vector<Sock> socks;
  const uint64_t ours = pidNamespace();
  while (dirent* e = ::readdir(d)) {
    int pid = 0;
    uint64_t ns = 0;
    if (!telemetry::parseSocketName(e->d_name, &pid, &ns)) continue;
    // --pid names a process of this namespace (others' pids mean nothing here)
    if (onlyPid == 0 || (pid == onlyPid && ns == ours)) socks.push_back({pid, ns, dir + "/" + e->d_name});
  }
  ::closedir(d);
  std::sort(socks.begin(), socks.end());
  int answered = 0;
  for (const auto& [pid, ns, path] : socks) {
    std::string out, why;
    if (!ask(path, 2000, &out, &why)) {
      if (ns == ours && ::kill(pid, 0) != 0 && errno == ESRCH) {
        ::unlink(path.c_str());  // its process is gone
        continue;
      }
      std::fprintf(stderr, "weft inspect: process %d did not answer at %s: %s\n", pid, path.c_str(), why.c_str());
      continue;
    }
    ++answered;
    if (json) {
      std::fputs(out.c_str(), stdout);
    } else {
      print(out);
    }
  }
  if (answered == 0 && !json) std::printf("weft inspect: no weft process of this user answers in %s\n", dir.c_str());
  return 0;
}

}  // namespace weft::tool

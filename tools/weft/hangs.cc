// SPDX-License-Identifier: Apache-2.0
// weft report --hangs DIR: the stall dumps of every rank (WEFT_TELEMETRY_DIR/hangs/weft-<host>-<pid>-<n>.json, and
// `weft inspect --json` answers saved beside them) joined into a wait-for graph, and its first line the cause
// (docs/hangs.md): a rank that died, a link where bytes stopped, the rank every chain of waits ends at, or a cycle.
//
// A process waits on another where one of its connections is stalled (or failed for its peer): the two ends of a
// connection are paired by address (a TCP connection's end names its own address, "local", which is the other
// end's "peer"); where a backend gives no local address, by the peer's IP when one process alone has it. A peer no
// dump names is shown by its address (it died, or never wrote one).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hangs.h"

namespace weft::tool {
namespace {

using nlohmann::json;

struct Conn {
  std::string dir, peer, local, device, kind;
  double stalledS = 0;
  uint64_t stalls = 0, msgs = 0, bytes = 0;
  int rank = -1, peerRank = -1, nranks = 0;  // the device API's ("dir":"rma"): this end's and the peer's ranks
};

struct Proc {
  std::string host;
  long pid = 0;
  uint64_t timeNs = 0;
  std::string file, reason;  // reason: what wrote the dump (stall, sigterm, live)
  std::vector<std::string> ranks;  // "rank 3 of 8 in <comm name or hash>"
  std::vector<std::string> rmaRanks;  // "rank 1 of 8 (device API)", from its device-API comms' lines
  std::vector<Conn> conns;
};

struct Wait {
  int from = -1;        // process index
  int to = -1;          // process index, or -1: only the address is known
  std::string toAddr;   // the peer's address as the waiting end names it
  const Conn* conn = nullptr;
};

std::string ipOf(const std::string& full) {
  // "10.0.0.1:4000", "[fe80::1%eth0]:4000", libfabric's "fi_sockaddr_in://10.0.0.1:4000", or a provider's own
  // name (returned whole).
  const auto scheme = full.find("://");
  const std::string addr = scheme == std::string::npos ? full : full.substr(scheme + 3);
  if (!addr.empty() && addr[0] == '[') {
    const auto close = addr.find(']');
    return close == std::string::npos ? addr : addr.substr(1, close - 1);
  }
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || addr.find(':') != colon) return addr;
  return addr.substr(0, colon);
}

// One dump file: JSON lines, the first {"type":"process",...}. False when it is not one.
bool loadDump(const std::filesystem::path& path, Proc* p) {
  std::ifstream in(path);
  std::string line;
  bool first = true;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) return false;
    const std::string type = j.value("type", "");
    if (first) {
      if (type != "process") return false;
      p->host = j.value("host", "");
      p->pid = j.value("pid", 0L);
      p->timeNs = j.value("time_ns", uint64_t{0});
      p->file = path.string();
      p->reason = j.value("reason", "");
      first = false;
      continue;
    }
    if (type == "comm") {
      const std::string name = j.value("comm_name", "");
      p->ranks.push_back("rank " + std::to_string(j.value("rank", -1)) + " of " + std::to_string(j.value("nranks", 0)) +
                         " in " + (name.empty() ? j.value("comm", "") : name));
    } else if (type == "conn") {
      Conn c;
      c.dir = j.value("dir", "");
      c.peer = j.value("peer", "");
      c.local = j.value("local", "");
      c.device = j.value("device", "");
      c.kind = j.value("stall_kind", "");
      c.stalledS = j.value("stalled_s", 0.0);
      c.stalls = j.value("stalls", uint64_t{0});
      c.msgs = j.value("msgs", uint64_t{0});
      c.bytes = j.value("bytes", uint64_t{0});
      if (c.dir == "rma") {
        c.rank = j.value("rank", -1);
        c.peerRank = j.value("peer_rank", -1);
        c.nranks = j.value("nranks", 0);
        // The process's own rank in the device API's comm, where no profiler communicator names it.
        const std::string mine = "rank " + std::to_string(j.value("rank", -1)) + " of " + std::to_string(c.nranks) +
                                 " (device API)";
        if (std::find(p->rmaRanks.begin(), p->rmaRanks.end(), mine) == p->rmaRanks.end()) p->rmaRanks.push_back(mine);
      }
      p->conns.push_back(std::move(c));
    }
  }
  return !first;
}

std::string procName(const Proc& p) {
  std::string s = p.host + " pid " + std::to_string(p.pid);
  const std::vector<std::string>& ranks = p.ranks.empty() ? p.rmaRanks : p.ranks;
  if (ranks.size() == 1) return ranks[0] + " (" + s + ")";
  if (!ranks.empty()) {
    s += " (";
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "; " : "") + ranks[i];
    s += ")";
  }
  return s;
}

// Stalled now, or failed for its peer: a kind outlives its stall only once the peer is lost (StallState).
bool waiting(const Conn& c) { return c.stalledS > 0 || !c.kind.empty(); }

struct Graph {
  std::vector<Proc> procs;
  std::vector<Wait> waits;
  std::string cause, causeKind;
  std::vector<std::string> causeNodes;  // names of the processes or addresses the cause names
};

void build(Graph* g) {
  std::map<std::string, int> byLocal;            // a connection end's own address -> its process
  std::map<std::string, std::set<int>> byIp;     // an IP -> the processes with an end there
  for (int i = 0; i < static_cast<int>(g->procs.size()); ++i) {
    for (const Conn& c : g->procs[i].conns) {
      if (c.local.empty()) continue;
      byLocal[c.local] = i;
      byIp[ipOf(c.local)].insert(i);
    }
  }
  for (int i = 0; i < static_cast<int>(g->procs.size()); ++i) {
    for (const Conn& c : g->procs[i].conns) {
      if (!waiting(c)) continue;
      Wait w;
      w.from = i;
      w.toAddr = c.peer;
      w.conn = &c;
      if (auto it = byLocal.find(c.peer); it != byLocal.end()) {
        w.to = it->second;
      } else if (c.dir == "rma") {
        // The device API's ends name both addresses: no match means the peer left no dump, unless a process shows
        // the peer's rank in a comm of the same size (its end of this pair gone from its ledger). Never by IP: the
        // ranks of one host share it.
        std::set<int> ranked;
        for (int j = 0; j < static_cast<int>(g->procs.size()); ++j) {
          for (const Conn& o : g->procs[j].conns) {
            if (j != i && o.dir == "rma" && o.rank == c.peerRank && o.nranks == c.nranks) ranked.insert(j);
          }
        }
        if (ranked.size() == 1) w.to = *ranked.begin();
      } else if (auto ip = byIp.find(ipOf(c.peer)); ip != byIp.end()) {
        std::set<int> others = ip->second;
        others.erase(i);
        if (others.size() == 1) w.to = *others.begin();
      }
      g->waits.push_back(w);
    }
  }
}

// A peer with no dump is named by its IP: the two ends of its connections name different ports of it.
std::string target(const Graph& g, const Wait& w) {
  if (w.to >= 0) return procName(g.procs[static_cast<size_t>(w.to)]);
  // The device API's waiting end knows its peer's rank.
  const std::string rank = w.conn != nullptr && w.conn->peerRank >= 0
                               ? "rank " + std::to_string(w.conn->peerRank) + " of " + std::to_string(w.conn->nranks) +
                                     " (device API), "
                               : std::string();
  const std::string ip = ipOf(w.toAddr);
  if (ip.empty()) return rank.empty() ? "a process of no address (no dump from it)" : rank + "no dump from it";
  return rank + "a process at " + ip + " (no dump from it)";
}

// A cycle among processes that each wait on the next, found by a depth-first walk; empty when there is none.
std::vector<int> findCycle(const Graph& g) {
  const int n = static_cast<int>(g.procs.size());
  std::vector<std::vector<int>> out(static_cast<size_t>(n));
  for (const Wait& w : g.waits) {
    if (w.to >= 0 && w.to != w.from) out[static_cast<size_t>(w.from)].push_back(w.to);
  }
  std::vector<int> state(static_cast<size_t>(n), 0), parent(static_cast<size_t>(n), -1);
  std::vector<int> cycle;
  std::function<bool(int)> dfs = [&](int u) {
    state[static_cast<size_t>(u)] = 1;
    for (int v : out[static_cast<size_t>(u)]) {
      if (state[static_cast<size_t>(v)] == 1) {
        for (int x = u; x != v; x = parent[static_cast<size_t>(x)]) cycle.push_back(x);
        cycle.push_back(v);
        std::reverse(cycle.begin(), cycle.end());
        return true;
      }
      if (state[static_cast<size_t>(v)] == 0) {
        parent[static_cast<size_t>(v)] = u;
        if (dfs(v)) return true;
      }
    }
    state[static_cast<size_t>(u)] = 2;
    return false;
  };
  for (int u = 0; u < n && cycle.empty(); ++u) {
    if (state[static_cast<size_t>(u)] == 0) dfs(u);
  }
  return cycle;
}

// The first line: a peer lost, then a link where bytes stopped, then where every chain of waits ends, then a cycle.
void findCause(Graph* g) {
  std::set<std::string> gone, links, ends;
  // A lost peer that wrote a dump of its own was alive to write it: the connection broke between two live processes
  // (the link, or a host on it), which the link cause names; one with no dump is the dead one.
  for (const Wait& w : g->waits) {
    if (w.conn->kind == "peer_gone" && w.to < 0) gone.insert(target(*g, w));
  }
  if (!gone.empty()) {
    g->causeKind = "dead";
    g->causeNodes.assign(gone.begin(), gone.end());
    g->cause = (gone.size() == 1 ? "a rank died or was lost: " : "ranks died or were lost: ");
    for (const auto& s : gone) g->cause += (s == *gone.begin() ? "" : "; ") + s;
    g->cause += ". Its peers' connections to it failed: it closed them, or answered nothing for WEFT_PEER_TIMEOUT";
    return;
  }
  // A link is named once, whichever end saw it, with the NICs its ends named.
  std::map<std::pair<std::string, std::string>, std::set<std::string>> linkNics;
  for (const Wait& w : g->waits) {
    if (w.conn->kind != "link" && !(w.conn->kind == "peer_gone" && w.to >= 0)) continue;
    std::string a = procName(g->procs[static_cast<size_t>(w.from)]), b = target(*g, w);
    if (b < a) std::swap(a, b);
    linkNics[{a, b}].insert(w.conn->device);
  }
  for (const auto& [ends2, nics] : linkNics) {
    std::string s = ends2.first + " <-> " + ends2.second + " (NIC ";
    for (const auto& n : nics) s += (n == *nics.begin() ? "" : ", ") + n;
    links.insert(s + ")");
  }
  if (!links.empty()) {
    g->causeKind = "link";
    g->causeNodes.assign(links.begin(), links.end());
    g->cause = "bytes stopped on the way (the link, or a host on it): ";
    for (const auto& s : links) g->cause += (s == *links.begin() ? "" : "; ") + s;
    return;
  }
  // Where chains end: a process waited on that waits on no one (or a peer with no dump, which cannot say).
  std::set<int> waitsOnSomeone;
  for (const Wait& w : g->waits) waitsOnSomeone.insert(w.from);
  for (const Wait& w : g->waits) {
    // (A process waiting on its own other end, a connection to itself, is where that chain ends too.)
    if (w.to < 0 || w.to == w.from || waitsOnSomeone.count(w.to) == 0) ends.insert(target(*g, w));
  }
  if (!ends.empty()) {
    g->causeKind = "behind";
    g->causeNodes.assign(ends.begin(), ends.end());
    g->cause = ends.size() == 1 ? "every chain of waits ends at " : "the chains of waits end at ";
    for (const auto& s : ends) g->cause += (s == *ends.begin() ? "" : "; ") + s;
    g->cause += ": it is behind (in compute, or not calling NCCL), and its peers' connections to it are up";
    return;
  }
  const std::vector<int> cycle = findCycle(*g);
  if (!cycle.empty()) {
    g->causeKind = "cycle";
    g->cause = "a cycle: ";
    for (int u : cycle) {
      g->causeNodes.push_back(procName(g->procs[static_cast<size_t>(u)]));
      g->cause += procName(g->procs[static_cast<size_t>(u)]) + " waits on ";
    }
    g->cause += procName(g->procs[static_cast<size_t>(cycle[0])]) +
                " (each posted its side toward the next and waits for it: the ranks disagree on the order of "
                "their operations)";
    return;
  }
  g->causeKind = "none";
  g->cause = "no connection in these dumps is stalled or lost its peer";
}

}  // namespace

int hangsReport(const std::string& dir, bool asJson) {
  Graph g;
  std::error_code ec;
  std::map<std::pair<std::string, long>, size_t> latest;  // (host, pid) -> index in g.procs
  size_t files = 0;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::fprintf(stderr, "weft report --hangs: %s is not a folder\n", dir.c_str());
    return 2;
  }
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->path().extension() != ".json") continue;
    Proc p;
    if (!loadDump(it->path(), &p)) continue;
    ++files;
    const auto key = std::make_pair(p.host, p.pid);
    if (auto at = latest.find(key); at == latest.end()) {
      latest[key] = g.procs.size();
      g.procs.push_back(std::move(p));
    } else if (p.timeNs >= g.procs[at->second].timeNs) {
      g.procs[at->second] = std::move(p);  // a process's newest dump stands
    }
  }
  if (g.procs.empty()) {
    std::fprintf(stderr,
                 "weft report --hangs: no stall dumps under %s (WEFT_TELEMETRY_DIR/hangs of each rank: written when "
                 "a connection stalls or loses its peer)\n", dir.c_str());
    return 1;
  }
  std::sort(g.procs.begin(), g.procs.end(), [](const Proc& a, const Proc& b) {
    return a.host != b.host ? a.host < b.host : a.pid < b.pid;
  });
  build(&g);
  findCause(&g);
  if (asJson) {
    json out;
    out["cause"] = {{"kind", g.causeKind}, {"text", g.cause}, {"names", g.causeNodes}};
    out["dumps"] = files;
    json procs = json::array();
    for (const Proc& p : g.procs) {
      procs.push_back({{"host", p.host}, {"pid", p.pid}, {"ranks", p.ranks}, {"file", p.file},
                       {"reason", p.reason}, {"conns", p.conns.size()}});
    }
    out["processes"] = procs;
    json waits = json::array();
    for (const Wait& w : g.waits) {
      const Proc& f = g.procs[static_cast<size_t>(w.from)];
      json j = {{"from", {{"host", f.host}, {"pid", f.pid}}},
                {"to", w.to >= 0 ? json{{"host", g.procs[static_cast<size_t>(w.to)].host},
                                        {"pid", g.procs[static_cast<size_t>(w.to)].pid}}
                                 : json(nullptr)},
                {"peer", w.toAddr},
                {"dir", w.conn->dir},
                {"device", w.conn->device},
                {"kind", w.conn->kind},
                {"stalled_s", w.conn->stalledS}};
      waits.push_back(j);
    }
    out["waits"] = waits;
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("weft report --hangs: %s\n", g.cause.c_str());
  std::printf("  %zu dumps from %zu processes; %zu connections wait\n", files, g.procs.size(), g.waits.size());
  std::printf("\n== who waits on whom (a connection stalled, or failed for its peer)\n");
  for (const Wait& w : g.waits) {
    std::printf("  %s  --%s on %s, %s, %.1f s-->  %s\n", procName(g.procs[static_cast<size_t>(w.from)]).c_str(),
                w.conn->dir.c_str(), w.conn->device.c_str(), w.conn->kind.empty() ? "stalled" : w.conn->kind.c_str(),
                w.conn->stalledS, target(g, w).c_str());
  }
  std::printf("\n== processes (each one's newest dump)\n");
  for (const Proc& p : g.procs) {
    size_t stalled = 0;
    for (const Conn& c : p.conns) stalled += waiting(c) ? 1 : 0;
    std::printf("  %s: %zu connections, %zu waiting  [%s%s%s]\n", procName(p).c_str(), p.conns.size(), stalled,
                p.reason.empty() ? "" : p.reason.c_str(), p.reason.empty() ? "" : ": ", p.file.c_str());
  }
  return 0;
}

}  // namespace weft::tool

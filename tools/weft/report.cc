// SPDX-License-Identifier: Apache-2.0
// weft report DIR: reads the timing records of every rank of a job (the JSON lines weft writes under
// WEFT_TELEMETRY_DIR), joins them by communicator and sequence number, and says what they mean:
//   - bus bandwidth per collective and message size, against the best seen for that size, per algorithm/protocol;
//   - stragglers: who starts late, who finishes late, and whom the others wait for (from the kernels' sync phases
//     where NCCL 2.32+ reports them, else execution times; neither needs clock agreement between hosts: a rank that
//     arrives late spends the least time waiting, and in the collective);
//   - per user tag (NCCL 2.32+): time share, bandwidth, time waiting for other ranks, and whom they wait for;
//   - locality: where each process's NICs sit against its GPU (connection records), flagging traffic that crosses
//     sockets or a NIC far from its GPU, named as the likely cause when that process is a straggler;
//   - the traffic mix (data-parallel large collectives, tensor-parallel small ones, pipeline send/recv,
//     all-to-all) and the share of time each takes;
//   - with --plot DIR: busbw_vs_size.svg and timeline.svg.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "args.h"
#include "hangs.h"
#include "svg.h"
#include "weft/telemetry/record.h"
#include "weft/telemetry/record_reader.h"

namespace weft::tool {
namespace {

using telemetry::Func;

// A record as the reader gives it, with its bus bandwidth (computed here, with nRanks completed).
struct Rec : telemetry::OpRecord {
  double busBw = 0;
};

struct Loaded {
  std::vector<Rec> recs;
  std::map<std::string, std::string> commNames;
  size_t files = 0, lines = 0, malformed = 0, otherSchema = 0;
  std::vector<std::string> problems;
  std::vector<telemetry::ConnRecord> conns;
  std::map<std::string, std::string> farCause;  // host:pid -> why its NIC is far from its GPU (locality())
};

void loadFile(const std::string& path, Loaded& L) {
  std::ifstream in(path);
  if (!in) {
    L.problems.push_back(path + ": cannot open");
    return;
  }
  ++L.files;
  std::string line, comm, name, err;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    Rec r;
    telemetry::ConnRecord conn;
    switch (telemetry::parseRecordLine(line, &r, &comm, &name, &err, &conn)) {
      case telemetry::LineKind::kEmpty:
        continue;
      case telemetry::LineKind::kConn:
        L.conns.push_back(std::move(conn));
        break;
      case telemetry::LineKind::kOp:
        L.recs.push_back(std::move(r));
        break;
      case telemetry::LineKind::kComm:
        if (!name.empty()) L.commNames[comm] = name;
        break;
      case telemetry::LineKind::kOther:
        break;
      case telemetry::LineKind::kMalformed:
        if (L.malformed++ < 5) L.problems.push_back(fmt::format("{}:{}: {}; skipped", path, n, err));
        break;
      case telemetry::LineKind::kOtherSchema:
        if (L.otherSchema++ < 5) L.problems.push_back(fmt::format("{}:{}: {}; skipped", path, n, err));
        break;
    }
    ++L.lines;
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string humanBytes(double b) {
  const char* u[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int i = 0;
  while (b >= 1000 && i < 5) b /= 1000, ++i;
  return i == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, u[i]);
}

std::string fmtUs(double us) { return us >= 10000 ? fmt::format("{:.1f}ms", us / 1000) : fmt::format("{:.1f}us", us); }

// The pattern a record belongs to (docs/timing.md lists the rules).
std::string patternOf(const Rec& r) {
  Func f = telemetry::funcFromName(r.func);
  if (r.type == "p2p" || f == Func::kSend || f == Func::kRecv) return "pipeline send/recv";
  if (f == Func::kAllToAll || f == Func::kGather || f == Func::kScatter) return "all-to-all";
  if ((f == Func::kAllReduce || f == Func::kReduceScatter || f == Func::kAllGather || f == Func::kAllGatherV) &&
      r.bytes >= (1u << 20))
    return "data-parallel (large collectives)";
  if (f == Func::kAllReduce || f == Func::kReduceScatter || f == Func::kAllGather || f == Func::kAllGatherV)
    return "tensor-parallel (small collectives)";
  return "other (broadcast/reduce)";
}

// The records of DIR (every *.jsonl in it, in name order) or of one file; false (said on stderr) when there is
// nothing to report.
bool loadRecords(const std::string& dir, Loaded& L) {
  std::string err;
  const std::vector<std::string> files = telemetry::recordFiles(dir, &err);
  if (!err.empty()) {
    std::fprintf(stderr, "weft report: %s\n", err.c_str());
    return false;
  }
  for (const auto& f : files) loadFile(f, L);
  for (const auto& p : L.problems) std::fprintf(stderr, "weft report: %s\n", p.c_str());
  if (L.recs.empty() && L.conns.empty()) {
    std::fprintf(stderr, "weft report: no collective, p2p or connection records in %s (%zu files, %zu lines)\n",
                 dir.c_str(), L.files, L.lines);
    return false;
  }
  return true;
}

// Per host and NIC of multi-rail connections: what they sent on it, how often they saw it go down and come back
// (and why), how many closed with it down, how often they failed it over and how many messages they moved off it
// (rail failover) and took it back (re-admission). Nothing where no connection had several rails.
void printRails(const Loaded& L) {
  struct Nic {
    uint64_t conns = 0, bytes = 0, downs = 0, recoveries = 0, closedDown = 0, failovers = 0, moved = 0, readmits = 0;
    std::map<std::string, uint64_t> why;
  };
  std::map<std::pair<std::string, std::string>, Nic> nics;
  for (const auto& c : L.conns) {
    for (const auto& r : c.rails) {
      Nic& n = nics[{c.host, r.device}];
      ++n.conns;
      n.bytes += r.bytes;
      n.downs += r.downs;
      n.recoveries += r.recoveries;
      if (!r.up) ++n.closedDown;
      n.failovers += r.failovers;
      n.moved += r.moved;
      n.readmits += r.readmits;
      if (r.downs > 0) n.why[r.lastDown] += 1;
    }
  }
  if (nics.empty()) return;
  std::printf("\n== rails (the NICs of multi-rail weft connections, per host: every connection's record together)\n");
  std::printf("  %-20s %-16s %7s %12s %7s %10s %11s %9s %7s %8s  %s\n", "host", "nic", "conns", "sent", "downs",
              "recoveries", "closed down", "failovers", "moved", "readmits", "last went down (connections)");
  for (const auto& [key, n] : nics) {
    std::string why;
    for (const auto& [w, k] : n.why) why += fmt::format("{}{} ({})", why.empty() ? "" : ", ", w, k);
    std::printf("  %-20s %-16s %7llu %12s %7llu %10llu %11llu %9llu %7llu %8llu  %s\n", key.first.c_str(),
                key.second.c_str(), static_cast<unsigned long long>(n.conns),
                humanBytes(static_cast<double>(n.bytes)).c_str(), static_cast<unsigned long long>(n.downs),
                static_cast<unsigned long long>(n.recoveries), static_cast<unsigned long long>(n.closedDown),
                static_cast<unsigned long long>(n.failovers), static_cast<unsigned long long>(n.moved),
                static_cast<unsigned long long>(n.readmits), why.empty() ? "-" : why.c_str());
  }
}

// The connections that reported stalls (docs/hangs.md), most first: where a hung or slow job waited on the network.
// Nothing where none did.
void printStalls(const Loaded& L) {
  std::vector<const telemetry::ConnRecord*> stalled;
  uint64_t total = 0;
  for (const auto& c : L.conns) {
    if (c.stalls == 0) continue;
    stalled.push_back(&c);
    total += c.stalls;
  }
  if (stalled.empty()) return;
  std::stable_sort(stalled.begin(), stalled.end(),
                   [](const auto* a, const auto* b) { return a->stalls > b->stalls; });
  std::printf("\n== stalls (connections that waited WEFT_STALL_S with nothing moving; the log's stall lines say on "
              "whom: docs/hangs.md)\n");
  std::printf("  %zu of %zu connections reported %llu stalls\n", stalled.size(), L.conns.size(),
              static_cast<unsigned long long>(total));
  std::printf("  %-20s %8s %-5s %-28s %-16s %7s\n", "host", "pid", "dir", "peer", "nic", "stalls");
  constexpr size_t kRows = 20;
  for (size_t i = 0; i < stalled.size() && i < kRows; ++i) {
    const telemetry::ConnRecord& c = *stalled[i];
    std::printf("  %-20s %8d %-5s %-28s %-16s %7llu\n", c.host.c_str(), c.pid, c.dir.c_str(), c.peer.c_str(),
                c.device.c_str(), static_cast<unsigned long long>(c.stalls));
  }
  if (stalled.size() > kRows) std::printf("  ... and %zu more\n", stalled.size() - kRows);
}

// ---- locality (docs/topology.md §records) ----------------------------------------------------------------------

int pathRank(const std::string& p) {
  static const char* const kOrder[] = {"PIX", "PXB", "PHB", "NODE", "SYS"};
  for (int i = 0; i < 5; ++i)
    if (p == kOrder[i]) return i;
  return -1;
}

// Per process (host:pid): its connections' NICs and NUMA nodes, its GPUs, and the farthest NIC-GPU path.
struct Placement {
  std::set<std::string> nics, gpus;
  std::set<int> numa;
  std::string worst, worstNic, worstGpu;
  size_t conns = 0;
};

std::map<std::string, Placement> placements(const Loaded& L) {
  std::map<std::string, Placement> out;
  for (const auto& c : L.conns) {
    if (c.numa < 0 && c.gpu.empty()) continue;  // written before weft recorded locality
    Placement& p = out[c.host + ":" + std::to_string(c.pid)];
    ++p.conns;
    p.nics.insert(c.device);
    if (c.numa >= 0) p.numa.insert(c.numa);
    if (!c.gpu.empty()) p.gpus.insert(c.gpu);
    if (pathRank(c.gpuPath) > pathRank(p.worst)) {
      p.worst = c.gpuPath;
      p.worstNic = c.device;
      p.worstGpu = c.gpu;
    }
  }
  return out;
}

// Why a process's traffic is slowed by where its NIC sits ("" when it is not): across sockets (SYS), or through the
// CPU's host bridge (PHB, NODE) instead of a PCIe switch the GPU shares.
std::string farCause(const Placement& p) {
  if (p.worst == "SYS")
    return fmt::format("its NIC {} is on the other socket from its GPU {} (SYS): every message crosses the socket "
                       "link", p.worstNic, p.worstGpu);
  if (p.worst == "PHB" || p.worst == "NODE")
    return fmt::format("its NIC {} is far from its GPU {} ({}: through the CPU's PCIe host bridge, not a switch they "
                       "share)", p.worstNic, p.worstGpu, p.worst);
  return {};
}

void printLocality(Loaded& L) {
  const auto all = placements(L);
  if (all.empty()) return;
  std::printf("\n== locality (connection records: each process's NICs, their NUMA node, and the path to its GPU)\n");
  std::printf("  %-24s %-20s %-6s %-14s %-5s %6s\n", "process", "nic", "numa", "gpu", "path", "conns");
  size_t far = 0;
  for (const auto& [where, p] : all) {
    std::string nics, numa, gpus;
    for (const auto& n : p.nics) nics += (nics.empty() ? "" : ",") + n;
    for (int n : p.numa) numa += (numa.empty() ? "" : ",") + std::to_string(n);
    for (const auto& g : p.gpus) gpus += (gpus.empty() ? "" : ",") + g;
    std::printf("  %-24s %-20s %-6s %-14s %-5s %6zu\n", where.c_str(), nics.c_str(), numa.empty() ? "-" : numa.c_str(),
                gpus.empty() ? "-" : gpus.c_str(), p.worst.empty() ? "-" : p.worst.c_str(), p.conns);
    const std::string cause = farCause(p);
    if (cause.empty()) continue;
    L.farCause[where] = cause;
    ++far;
  }
  for (const auto& [where, cause] : L.farCause)
    std::printf("  %s %s: %s\n", all.at(where).worst == "SYS" ? "CROSS-SOCKET" : "FAR-NIC", where.c_str(),
                cause.c_str());
  if (far == 0) std::printf("  every NIC is under a PCIe switch or root port its GPU shares (or its GPU is unknown)\n");
}

// Completes what older profilers do not record (nRanks: the ranks seen in the communicator) and the bandwidths,
// prints the header line; returns the job's first record start (the timeline's origin).
uint64_t prepareRecords(Loaded& L) {
  // nRanks is not known to NCCL < 2.27's profiler: take the number of ranks seen in the communicator.
  std::map<std::string, std::set<int>> ranksOf;
  for (const auto& r : L.recs) ranksOf[r.comm].insert(r.rank);
  for (auto& r : L.recs) {
    int n = r.nRanks > 0 ? r.nRanks : static_cast<int>(ranksOf[r.comm].size());
    r.nRanks = n;
    r.busBw = telemetry::busBwGBs(telemetry::funcFromName(r.func), r.bytes, n, r.execNs);
  }
  uint64_t t0 = UINT64_MAX, t1 = 0;
  std::set<std::string> procs;
  for (const auto& r : L.recs) {
    if (r.startNs) t0 = std::min(t0, r.startNs);
    t1 = std::max(t1, r.endNs);
    procs.insert(r.host + ":" + std::to_string(r.pid));
  }
  std::printf("weft report: %zu records from %zu files (%zu processes, %zu communicators), %.3f s of job time\n",
              L.recs.size(), L.files, procs.size(), ranksOf.size(), t1 > t0 ? (t1 - t0) / 1e9 : 0.0);
  if (L.malformed || L.otherSchema)
    std::printf("  (%zu malformed lines and %zu of another schema version skipped)\n", L.malformed, L.otherSchema);
  return t0;
}

void printBandwidth(const Loaded& L) {
  std::printf("\n== bus bandwidth per operation and size (GB/s, nccl-tests definition; GPU time where recorded)\n");
  std::printf("  %-14s %6s %7s %10s %9s %9s %6s  %s\n", "operation", "size", "count", "median", "busbw", "best",
              "ofbest", "by algorithm/protocol (median busbw, count)");
  struct Cell {
    std::vector<double> exec, bw;
    std::map<std::string, std::vector<double>> byAp;
  };
  std::map<std::pair<std::string, int>, Cell> cells;
  for (const auto& r : L.recs) {
    if (r.execNs == 0) continue;
    Cell& c = cells[{r.func, telemetry::octaveBucket(r.bytes)}];
    c.exec.push_back(r.execNs / 1e3);
    c.bw.push_back(r.busBw);
    c.byAp[r.type == "p2p" ? std::string("p2p") : r.algo + "/" + r.proto].push_back(r.busBw);
  }
  std::vector<std::string> slow;
  for (const auto& [k, c] : cells) {
    double med = median(c.bw), best = *std::max_element(c.bw.begin(), c.bw.end());
    std::string aps;
    for (const auto& [ap, v] : c.byAp) aps += fmt::format("{}{} {:.2f} ({})", aps.empty() ? "" : ", ", ap, median(v), v.size());
    std::printf("  %-14s %6s %7zu %10s %9.2f %9.2f %5.0f%%  %s\n", k.first.c_str(),
                telemetry::octaveBucketLabel(k.second), c.bw.size(), fmtUs(median(c.exec)).c_str(), med, best,
                best > 0 ? 100 * med / best : 0.0, aps.c_str());
    if (best > 0 && med < 0.7 * best && c.bw.size() >= 5)
      slow.push_back(fmt::format("{} {}: the median run reaches {:.0f}% of the best seen", k.first,
                                 telemetry::octaveBucketLabel(k.second), 100 * med / best));
    if (c.byAp.size() > 1) {
      std::string bestAp;
      double bestMed = -1, worstMed = 1e300;
      for (const auto& [ap, v] : c.byAp) {
        double m = median(v);
        if (m > bestMed) bestMed = m, bestAp = ap;
        worstMed = std::min(worstMed, m);
      }
      if (worstMed < 0.8 * bestMed)
        slow.push_back(fmt::format("{} {}: {} is fastest here ({:.2f} GB/s); others reach {:.0f}%", k.first,
                                   telemetry::octaveBucketLabel(k.second), bestAp, bestMed, 100 * worstMed / bestMed));
    }
  }
  for (const auto& s : slow) std::printf("  note: %s\n", s.c_str());

}

// Collectives joined across ranks by communicator, function and sequence number: who the others waited for.
struct Who {
  std::vector<double> lateStart, lateEnd, waited;
  int lastToStart = 0, joined = 0;
  std::string where;
};
struct Stragglers {
  std::map<std::pair<std::string, int>, Who> who;
  size_t joined = 0;    // collectives seen on every rank that recorded them (at least two)
  size_t byPhases = 0;  // of which every rank's record had kernel phases
};

// The time a rank spent waiting for the others in a collective: its kernels' sync phases where NCCL reported them
// (2.32+), else nothing (the execution time stands in).
double syncUs(const Rec& r) { return (r.phaseNs[0] + r.phaseNs[2]) / 1e3; }

// Over the collectives `keep` selects. Whom the others waited for: with kernel phases on every rank, the longest
// sync wait minus this rank's (a late rank hardly waits, the others wait for it); else the same from execution
// times (a rank that arrives late spends the least time in the collective). Neither needs agreeing clocks.
template <typename Keep>
Stragglers stragglers(const Loaded& L, Keep&& keep) {
  Stragglers out;
  std::map<std::tuple<std::string, std::string, uint64_t>, std::vector<const Rec*>> groups;
  for (const auto& r : L.recs)
    if (r.type == "coll" && keep(r)) groups[{r.comm, r.func, r.seq}].push_back(&r);
  for (const auto& [k, g] : groups) {
    std::set<int> ranks;
    bool phases = true;
    for (auto* r : g) {
      ranks.insert(r->rank);
      phases = phases && r->channelsPhased > 0;
    }
    if (ranks.size() < 2 || ranks.size() != g.size()) continue;  // one record per rank, at least two ranks
    ++out.joined;
    if (phases) ++out.byPhases;
    uint64_t minStart = UINT64_MAX, maxStart = 0, minEnd = UINT64_MAX;
    double maxWait = 0;
    for (auto* r : g) {
      minStart = std::min(minStart, r->startNs);
      maxStart = std::max(maxStart, r->startNs);
      minEnd = std::min(minEnd, r->endNs);
      maxWait = std::max(maxWait, phases ? syncUs(*r) : r->execNs / 1e3);
    }
    for (auto* r : g) {
      Who& w = out.who[{r->comm, r->rank}];
      w.where = r->host + ":" + std::to_string(r->pid);
      ++w.joined;
      w.lateStart.push_back((r->startNs - minStart) / 1e3);
      w.lateEnd.push_back((r->endNs - minEnd) / 1e3);
      w.waited.push_back(maxWait - (phases ? syncUs(*r) : r->execNs / 1e3));
      if (r->startNs == maxStart) ++w.lastToStart;
    }
  }
  return out;
}

// The ranks the others waited for: at least minUs, and more than 5x the typical rank.
std::vector<std::string> flagged(const Stragglers& st, double minUs, const std::string& what,
                                 const std::map<std::string, std::string>& farCause) {
  std::vector<double> all;
  for (const auto& [k, w] : st.who) all.push_back(median(w.waited));
  double typical = median(all);
  std::vector<std::string> out;
  for (const auto& [k, w] : st.who) {
    double waited = median(w.waited);
    if (waited >= minUs && waited > 5 * typical) {
      const auto cause = farCause.find(w.where);
      out.push_back(fmt::format("STRAGGLER {}comm {} rank {} ({}): the others waited a median {} for it in {} "
                                "collectives; it started last in {:.0f}% of them{}",
                                what, k.first, k.second, w.where, fmtUs(waited), w.joined,
                                100.0 * w.lastToStart / std::max(1, w.joined),
                                cause == farCause.end() ? "" : "; likely cause: " + cause->second));
    }
  }
  return out;
}

void printStragglers(const Loaded& L, double stragglerMinUs) {
  std::printf("\n== stragglers (collectives joined across ranks by communicator and sequence number)\n");
  const Stragglers st = stragglers(L, [](const Rec&) { return true; });
  if (st.joined == 0) {
    std::printf("  no collective was recorded on more than one rank: nothing to compare\n");
    return;
  }
  std::printf("  %zu collectives joined. Per rank: median late start and late finish (wall clock, needs synchronized"
              " clocks across hosts),\n  and how long the others waited for it (%s: needs no clock agreement).\n",
              st.joined,
              st.byPhases == st.joined ? "from the kernels' sync phases"
              : st.byPhases > 0        ? "from the kernels' sync phases where every rank had them, else execution times"
                                       : "from execution times");
  std::printf("  %-20s %5s %-22s %11s %11s %11s %9s\n", "communicator", "rank", "process", "late start", "late end",
              "others wait", "last in");
  for (const auto& [k, w] : st.who)
    std::printf("  %-20s %5d %-22s %11s %11s %11s %8.0f%%\n", k.first.c_str(), k.second, w.where.c_str(),
                fmtUs(median(w.lateStart)).c_str(), fmtUs(median(w.lateEnd)).c_str(), fmtUs(median(w.waited)).c_str(),
                100.0 * w.lastToStart / std::max(1, w.joined));
  const auto f = flagged(st, stragglerMinUs, "", L.farCause);
  if (f.empty()) std::printf("  no straggler: no rank is waited for more than 5x the typical rank\n");
  for (const auto& x : f) std::printf("  %s\n", x.c_str());
}

// A tag as the user knows it: the name the writer had for it (WEFT_TAG_NAMES), else its number.
std::string tagLabel(uint64_t tag, const std::map<uint64_t, std::string>& names) {
  if (tag == 0) return "untagged";
  auto it = names.find(tag);
  return it != names.end() ? it->second : std::to_string(tag);
}

// Per user tag (NCCL 2.32+: the userProfilerTag of the application's ncclCollConfig_t): which part of the step
// takes the time, how fast it moves data, how long its kernels wait for other ranks, and whom they wait for.
void printTags(const Loaded& L, double stragglerMinUs) {
  struct Tag {
    uint64_t count = 0, bytes = 0, ns = 0, phasedNs = 0;
    double syncUs = 0;
    std::vector<double> bw;
  };
  std::map<uint64_t, Tag> tags;
  std::map<uint64_t, std::string> names;
  uint64_t totalNs = 0;
  bool anyTagged = false;
  for (const auto& r : L.recs) {
    Tag& t = tags[r.tag];
    ++t.count;
    t.bytes += r.bytes;
    t.ns += r.execNs;
    if (r.execNs > 0) t.bw.push_back(r.busBw);
    if (r.channelsPhased > 0) {
      t.syncUs += syncUs(r);
      t.phasedNs += r.execNs;
    }
    totalNs += r.execNs;
    if (r.tag != 0) anyTagged = true;
    if (r.tag != 0 && !r.tagName.empty()) names[r.tag] = r.tagName;
  }
  if (!anyTagged) return;
  std::printf("\n== user tags (NCCL 2.32+: the userProfilerTag of each call; time is execution time summed over ranks;\n"
              "   sync wait: the share of the kernels' time spent waiting for other ranks, where they report phases)\n");
  std::printf("  %-16s %8s %12s %12s %6s %13s %10s  %s\n", "tag", "count", "bytes", "time", "share", "median busbw",
              "sync wait", "waited for most (median)");
  std::vector<std::string> notes;
  for (const auto& [tag, t] : tags) {
    const std::string label = tagLabel(tag, names);
    const Stragglers st = stragglers(L, [tag = tag](const Rec& r) { return r.tag == tag; });
    std::string most = "-";
    double mostWait = 0;
    for (const auto& [k, w] : st.who) {
      double m = median(w.waited);
      if (m > mostWait) {
        mostWait = m;
        most = fmt::format("rank {} of {} ({})", k.second, k.first, fmtUs(m));
      }
    }
    std::printf("  %-16s %8llu %12s %12s %5.1f%% %8.2f GB/s %9s  %s\n", label.c_str(),
                static_cast<unsigned long long>(t.count), humanBytes(static_cast<double>(t.bytes)).c_str(),
                fmtUs(t.ns / 1e3).c_str(), totalNs ? 100.0 * t.ns / totalNs : 0.0, median(t.bw),
                t.phasedNs > 0 ? fmt::format("{:.1f}%", 100.0 * t.syncUs * 1e3 / t.phasedNs).c_str() : "-",
                most.c_str());
    for (auto& f : flagged(st, stragglerMinUs, "tag " + label + ": ", L.farCause)) notes.push_back(std::move(f));
  }
  for (const auto& n : notes) std::printf("  %s\n", n.c_str());
}

void printTrafficMix(const Loaded& L) {
  std::printf("\n== traffic mix (per record on each rank; time is execution time summed over ranks)\n");
  struct Mix {
    uint64_t count = 0, bytes = 0, ns = 0;
  };
  std::map<std::string, Mix> mix;
  uint64_t totalNs = 0;
  for (const auto& r : L.recs) {
    Mix& m = mix[patternOf(r)];
    ++m.count;
    m.bytes += r.bytes;
    m.ns += r.execNs;
    totalNs += r.execNs;
  }
  std::printf("  %-38s %8s %12s %12s %6s\n", "pattern", "count", "bytes", "time", "share");
  for (const auto& [k, m] : mix)
    std::printf("  %-38s %8llu %12s %12s %5.1f%%\n", k.c_str(), static_cast<unsigned long long>(m.count),
                humanBytes(static_cast<double>(m.bytes)).c_str(), fmtUs(m.ns / 1e3).c_str(),
                totalNs ? 100.0 * m.ns / totalNs : 0.0);

}

// busbw_vs_size.svg and timeline.svg in plotDir; false (said on stderr) when one cannot be written.
bool writePlots(const Loaded& L, const std::string& plotDir, uint64_t t0) {
  mkdir(plotDir.c_str(), 0775);
  svg::Plot bw;
  bw.title = "bus bandwidth vs message size";
  bw.xLabel = "message size (bytes)";
  bw.yLabel = "busbw (GB/s, median)";
  bw.logX = bw.bytesX = true;
  std::map<std::string, std::map<int, std::vector<double>>> byAlgo;
  for (const auto& r : L.recs)
    if (r.execNs > 0 && r.type == "coll")
      byAlgo[r.func + " " + r.algo + "/" + r.proto][telemetry::octaveBucket(r.bytes)].push_back(r.busBw);
  for (const auto& [name, buckets] : byAlgo) {
    svg::Series s{name, {}, true};
    for (const auto& [b, v] : buckets) s.points.push_back({std::ldexp(1.0, b), median(v)});
    bw.series.push_back(s);
  }
  svg::Plot tl;
  tl.title = "time per operation over the run";
  tl.xLabel = "seconds since the first record";
  tl.yLabel = "execution time (us)";
  std::map<std::string, svg::Series> byFunc;
  for (const auto& r : L.recs) {
    auto& s = byFunc[r.func];
    s.name = r.func;
    s.lines = false;
    s.points.push_back({(r.startNs - t0) / 1e9, r.execNs / 1e3});
  }
  for (auto& [k, s] : byFunc) tl.series.push_back(s);
  std::string err;
  for (auto [name, text] : {std::pair{"busbw_vs_size.svg", svg::render(bw)}, std::pair{"timeline.svg", svg::render(tl)}}) {
    std::string path = plotDir + "/" + name;
    if (!svg::writeFile(path, text, &err)) {
      std::fprintf(stderr, "weft report: %s\n", err.c_str());
      return false;
    }
    std::printf("\nplot: %s", path.c_str());
  }
  std::printf("\n");
  return true;
}

}  // namespace

int reportCommand(int argc, char** argv) {
  std::string dir, plotDir;
  double stragglerMinUs = 20;
  bool hangs = false, json = false;
  harness::Args a("weft report", argc, argv, 2);
  std::vector<std::string> positional;
  // first non-flag argument is the directory
  if (argc >= 3 && argv[2][0] != '-') {
    dir = argv[2];
    a = harness::Args("weft report", argc, argv, 3);
  }
  while (a.next()) {
    const std::string& f = a.flag();
    if (f == "--dir") dir = a.value();
    else if (f == "--plot") plotDir = a.value();
    else if (f == "--straggler-min-us") stragglerMinUs = a.number(0, 100000000);
    else if (f == "--hangs") hangs = true;
    else if (f == "--json") json = true;
    else if (!f.empty() && f[0] != '-' && dir.empty()) dir = f;  // weft report --hangs DIR
    else a.unknown();
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: weft report DIR [--plot OUTDIR] [--straggler-min-us N]\n"
                         "       weft report DIR --hangs [--json]\n");
    return 2;
  }
  if (hangs) return hangsReport(dir, json);
  if (json) {
    std::fprintf(stderr, "weft report: --json goes with --hangs\n");
    return 2;
  }
  Loaded L;
  if (!loadRecords(dir, L)) return 1;
  if (L.recs.empty()) {  // connections only (a run of weft conformance or bench, no NCCL profiler)
    std::printf("weft report: no collective or p2p records; %zu connection records from %zu files\n", L.conns.size(),
                L.files);
    printLocality(L);
    printRails(L);
    printStalls(L);
    return 0;
  }
  const uint64_t t0 = prepareRecords(L);
  printBandwidth(L);
  printLocality(L);  // before the stragglers: they name its findings as likely causes
  printStragglers(L, stragglerMinUs);
  printTags(L, stragglerMinUs);
  printTrafficMix(L);
  printRails(L);
  printStalls(L);
  if (!plotDir.empty() && !writePlots(L, plotDir, t0)) return 1;
  return 0;
}

}  // namespace weft::tool

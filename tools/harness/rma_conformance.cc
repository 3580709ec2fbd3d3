// SPDX-License-Identifier: Apache-2.0
// weft conformance --rma's runner: forks the ranks, runs every check on each in lockstep, reaps them and joins their
// verdicts (a rank that crashed or hung is named where it stopped).
#include "rma_conformance.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "crash_report.h"
#include "netns.h"
#include "rma_rank.h"
#include "verdict.h"

namespace weft::harness {
namespace rmacheck {

// The ranks: shared memory made before they fork (their bootstrap), one process each running `body(rank)`, which
// never returns. nullptr when the shared memory cannot be had.
Shared* forkRanks(int n, std::vector<pid_t>* pids, const std::function<void(Shared*, int)>& body) {
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return nullptr;
  new (sh) Shared();
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      body(sh, r);
      _exit(0);
    }
    pids->push_back(pid);
  }
  return sh;
}

namespace {

bool selected(const RmaOptions& o, const std::string& name) {
  auto match = [&](const std::vector<std::string>& v) {
    for (const auto& p : v) {
      if (name.compare(0, p.size(), p) == 0) return true;
    }
    return false;
  };
  if (name.rfind("setup.", 0) == 0 || name == "teardown") return true;
  if (!o.only.empty() && !match(o.only)) return false;
  return !match(o.skip);
}

[[noreturn]] void rankMain(const RmaOptions& o, Shared* sh, int rank) {
  installCrashReport(("rank " + std::to_string(rank)).c_str());
  Rank k;
  k.o = &o;
  k.sh = sh;
  k.rank = rank;
  k.nranks = o.ranks;
  std::string why;
  if (!o.netns.empty()) {
    if (std::string e = joinNetns(o.netns[static_cast<size_t>(rank) % o.netns.size()]); !e.empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, e.c_str());
      _exit(5);
    }
  }
  k.api = RmaApi::load(o.plugin, o.symbol, o.table, &why);
  if (k.api == nullptr) _exit(3);
  if (o.mem == "cuda") {
    k.cu = CudaDriver::get(&why);
    if (k.cu == nullptr) _exit(4);
    installDeviceFaultReport();
  }
  const auto all = checks();
  for (size_t i = 0; i < all.size(); ++i) {
    const Check& c = all[i];
    sh->current[rank].store(static_cast<int>(i));
    auto& v = sh->verdicts[i][rank];
    std::string msg;
    int state;
    if (!selected(o, c.name)) {
      state = 3;
      msg = "not selected";
    } else if (std::string s = c.skip(k); !s.empty()) {
      state = 3;
      msg = s;
    } else {
      if (!k.barrier()) {
        state = 2;
        msg = "a rank did not reach the check";
      } else {
        msg = c.run(k);
        state = msg.empty() ? 1 : 2;
      }
    }
    std::snprintf(v.msg, sizeof(v.msg), "%s", msg.c_str());
    v.state.store(state);
    if (k.deadDone && std::strcmp(c.name, "faults.dead_rank") == 0) {
      // The survivors' comm has lost a rank: tearing it down is checked by closing it, nothing else.
      continue;
    }
  }
  std::fflush(stderr);
  _exit(0);
}

}  // namespace
}  // namespace rmacheck

using namespace rmacheck;

int listRmaChecks() {
  for (const auto& c : checks()) std::printf("%-24s %s\n", c.name, c.what);
  return 0;
}

int runRmaConformance(const RmaOptions& o) {
  setRmaVerbose(o.verbose);
  if (o.ranks < 1 || o.ranks > kMaxRanks) {
    std::fprintf(stderr, "weft conformance --rma: --ranks wants 1 to %d\n", kMaxRanks);
    return 2;
  }
  std::string why;
  RmaApi* probe = RmaApi::load(o.plugin, o.symbol, o.table, &why);
  if (probe == nullptr) {
    std::fprintf(stderr, "weft conformance --rma: %s: %s\n", o.plugin.c_str(), why.c_str());
    return 2;
  }
  std::printf("# %s: %s (table v%d, \"%s\"), %d ranks, %s memory\n", o.plugin.c_str(), probe->symbol().c_str(),
              probe->version(), probe->name(), o.ranks, o.mem.c_str());
  std::fflush(stdout);
  std::vector<pid_t> pids;
  Shared* sh = forkRanks(o.ranks, &pids, [&](Shared* s, int r) { rankMain(o, s, r); });
  if (sh == nullptr) return 2;
  auto end = Clock::now() + std::chrono::seconds(o.timeoutSec);
  int alive = o.ranks;
  std::vector<int> exitCode(static_cast<size_t>(o.ranks), -1);
  bool hung = false;
  int crashed = -1;  // the first rank that a signal other than SIGKILL (the dead-rank victim's own) ended
  while (alive > 0) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < o.ranks; ++r) {
        if (pids[r] == p) {
          sh->dead.fetch_or(1u << r);
          exitCode[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          --alive;
          if (WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL && crashed < 0) {
            // A crash: the others may wait on it forever inside the plugin (a connect with no deadline). They get a
            // short grace to say what they saw, then the run ends instead of waiting out --timeout.
            crashed = r;
            end = std::min(end, Clock::now() + std::chrono::seconds(kCrashGraceSec));
          }
        }
      }
      continue;
    }
    if (Clock::now() > end) {
      hung = true;
      for (int r = 0; r < o.ranks; ++r) {
        if (exitCode[r] < 0) kill(pids[r], SIGKILL);
      }
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto all = checks();
  int failed = 0, passed = 0, skipped = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    int state = 0;
    std::string msg;
    bool allSkip = true;
    for (int r = 0; r < o.ranks; ++r) {
      const auto& v = sh->verdicts[i][r];
      const int s = v.state.load();
      if (s == 0) {
        // A rank with no verdict: it died before (the dead-rank check's victim is expected to), or it hung here.
        const bool victim = std::strcmp(all[i].name, "faults.dead_rank") == 0 && r == o.ranks - 1;
        if (victim || (i > 0 && std::strcmp(all[i - 1].name, "faults.dead_rank") == 0 && r == o.ranks - 1) ||
            (std::strcmp(all[i].name, "teardown") == 0 && r == o.ranks - 1 && sh->verdicts[i - 1][r].state == 0)) {
          continue;
        }
        if (sh->current[r].load() == static_cast<int>(i)) {
          // Every rank that stopped here is named: the one that crashed first, then those that hung after it.
          std::string m;
          if (exitCode[r] >= 0) {
            m = "rank " + std::to_string(r) + " ended here (exit " + std::to_string(exitCode[r]) + ")";
          } else if (crashed >= 0) {
            m = "rank " + std::to_string(r) + " hung here after rank " + std::to_string(crashed) + " crashed (signal " +
                std::to_string(exitCode[crashed] - 128) + ")";
          } else {
            m = "rank " + std::to_string(r) + " hung here (no verdict within --timeout)";
          }
          msg = state == 2 && !msg.empty() ? msg + "; " + m : m;
          state = 2;
        }
        continue;
      }
      if (s != 3) allSkip = false;
      if (s == 2 && state != 2) {
        state = 2;
        msg = "rank " + std::to_string(r) + ": " + v.msg;
      } else if (s == 3 && msg.empty()) {
        msg = v.msg;
      }
    }
    if (state == 0) state = allSkip ? 3 : 1;
    const char* word = state == 1 ? "PASS" : state == 2 ? "FAIL" : "SKIP";
    std::printf("%-4s %-24s %s%s\n", word, all[i].name, state == 1 ? "" : "", state == 1 ? all[i].what : msg.c_str());
    if (state == 1) ++passed;
    if (state == 2) ++failed;
    if (state == 3) ++skipped;
  }
  for (int r = 0; r < o.ranks; ++r) {
    if (exitCode[r] == 3 || exitCode[r] == 4) {
      std::printf("FAIL rank %d could not load the plugin or the CUDA driver\n", r);
      ++failed;
    }
    if (exitCode[r] == 5) {
      std::printf("FAIL rank %d could not join its network namespace (--netns)\n", r);
      ++failed;
    }
  }
  std::printf("# %d passed, %d failed, %d skipped%s\n", passed, failed, skipped, hung ? " (the run hung)" : "");
  munmap(sh, sizeof(Shared));
  return hung ? 1 : verdictExitCode(passed, failed);
}

}  // namespace weft::harness

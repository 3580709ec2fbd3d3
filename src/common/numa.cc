// SPDX-License-Identifier: Apache-2.0
#include "weft/common/numa.h"

#include <dirent.h>
#include <pthread.h>
#include <linux/mempolicy.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "weft/common/log.h"
#include "weft/common/params.h"
#include "weft/common/topology.h"

namespace weft::numa {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kRegion = size_t{2} << 20;  // carved into blocks
constexpr size_t kLarge = size_t{256} << 10;  // a block at least this big gets a mapping of its own
constexpr int kMaskWords = 16;                // nodes 0-1022

size_t roundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

long mbindPreferred(void* base, size_t len, int node) {
  unsigned long mask[kMaskWords] = {};
  mask[node / 64] |= 1ul << (node % 64);
  return syscall(SYS_mbind, base, len, MPOL_PREFERRED, mask, kMaskWords * 64, 0);
}

struct Region {
  char* base = nullptr;
  size_t size = 0, used = 0;
  int node = -1;
};

// The arena. Lock: mu_ guards everything in it; it is taken when a comm, a chunk of requests or a staging buffer is
// made or freed, never on the data path.
class Arena {
 public:
  void* allocate(size_t bytes, int node) {
    const size_t size = roundUp(std::max<size_t>(bytes, 1), kAlign);
    std::lock_guard<std::mutex> lock(mu_);
    if (refused_.count(node) == 0) {
      if (void* p = fromNode(size, node)) {
        sizes_[p] = size;
        ++inUse_;
        inUseBytes_ += size;
        return p;
      }
    }
    ++fallbacks_;
    return nullptr;  // the caller takes the heap
  }

  // True when `p` was the arena's (and is now free).
  bool deallocate(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto b = sizes_.find(p);
    if (b == sizes_.end()) return false;
    const size_t size = b->second;
    sizes_.erase(b);
    --inUse_;
    inUseBytes_ -= size;
    auto it = regions_.upper_bound(static_cast<char*>(p));
    --it;  // the block's region: it was carved from one
    Region& r = it->second;
    if (size >= kLarge) {  // a mapping of its own
      munmap(r.base, r.size);
      regionBytes_ -= r.size;
      regions_.erase(it);
      return true;
    }
    free_[{r.node, size}].push_back(p);
    return true;
  }

  void lockForFork() { mu_.lock(); }
  void unlockAfterFork() { mu_.unlock(); }

  Stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s;
    s.regions = regions_.size();
    s.regionBytes = regionBytes_;
    s.blocksInUse = inUse_;
    s.bytesInUse = inUseBytes_;
    s.fallbacks = fallbacks_;
    return s;
  }

 private:
  void* fromNode(size_t size, int node) {
    if (size >= kLarge) {
      Region* r = map(roundUp(size, 4096), node);
      if (r == nullptr) return nullptr;
      r->used = r->size;
      return r->base;
    }
    auto& list = free_[{node, size}];
    if (!list.empty()) {
      void* p = list.back();
      list.pop_back();
      return p;
    }
    Region*& cur = current_[node];
    if (cur == nullptr || cur->size - cur->used < size) {
      cur = map(kRegion, node);
      if (cur == nullptr) return nullptr;
    }
    void* p = cur->base + cur->used;
    cur->used += size;
    return p;
  }

  Region* map(size_t len, int node) {
    void* base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;  // no memory: the heap will say so too
    if (mbindPreferred(base, len, node) != 0) {
      const int err = errno;
      munmap(base, len);
      refused_.insert(node);
      WEFT_WARN("NUMA node {}: the kernel refuses to place memory there (mbind: {}); weft's host memory for its "
                "NICs comes from the ordinary heap", node, std::strerror(err));
      return nullptr;
    }
    Region r;
    r.base = static_cast<char*>(base);
    r.size = len;
    r.node = node;
    regionBytes_ += len;
    return &regions_.emplace(r.base, r).first->second;
  }

  std::mutex mu_;
  std::map<char*, Region> regions_;  // by base address (std::map: Region pointers stay valid)
  std::map<int, Region*> current_;   // the region each node carves from
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;
  std::map<void*, size_t> sizes_;  // every block in use: its size (callers free without saying it)
  std::set<int> refused_;
  size_t regionBytes_ = 0, inUse_ = 0, inUseBytes_ = 0, fallbacks_ = 0;
};

Arena& arena() {
  // Never destroyed: blocks may be freed by static destructors after main. A fork while another thread holds the
  // arena's lock would leave the child's copy locked forever: the lock is taken around fork, as malloc's is.
  static Arena* a = [] {
    auto* made = new Arena();
    pthread_atfork([] { arena().lockForFork(); }, [] { arena().unlockAfterFork(); },
                   [] { arena().unlockAfterFork(); });
    return made;
  }();
  return *a;
}

std::atomic<int> gHomeNode{-1};

std::vector<int> affinityOf(pid_t tid) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(tid, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

}  // namespace

bool placementOn() {
  const std::string& mode = params::getString("WEFT_NUMA");
  if (mode == "off") return false;
  const topo::Topology& t = topo::Topology::host();
  if (!t.thisSystem() || t.numa().empty()) return false;
  return mode == "on" || t.numa().size() > 1;
}

void* allocate(size_t bytes, int node) noexcept {
  if (node >= 0 && node < kMaskWords * 64 - 1 && placementOn()) {
    if (void* p = arena().allocate(bytes, node)) return p;
  }
  return ::operator new(roundUp(std::max<size_t>(bytes, 1), kAlign), std::align_val_t{kAlign}, std::nothrow);
}

void deallocate(void* p) noexcept {
  if (p == nullptr) return;
  if (arena().deallocate(p)) return;
  ::operator delete(p, std::align_val_t{kAlign});
}

Stats stats() { return arena().stats(); }

int nodeOfPage(const void* p) {
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, const_cast<void*>(p), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
}

std::string policyOf(const void* p) {
  int mode = -1;
  unsigned long mask[kMaskWords] = {};
  if (syscall(SYS_get_mempolicy, &mode, mask, kMaskWords * 64, const_cast<void*>(p), MPOL_F_ADDR) != 0) {
    return std::string("unknown (") + std::strerror(errno) + ")";
  }
  std::string nodes;
  for (int n = 0; n < kMaskWords * 64; ++n) {
    if (mask[n / 64] & (1ul << (n % 64))) nodes += (nodes.empty() ? " " : ",") + std::to_string(n);
  }
  switch (mode) {
    case MPOL_DEFAULT: return "default";
    case MPOL_PREFERRED: return "preferred" + nodes;
    case MPOL_BIND: return "bind" + nodes;
    case MPOL_INTERLEAVE: return "interleave" + nodes;
    default: return "mode " + std::to_string(mode) + nodes;
  }
}

std::vector<int> chooseCpus(const std::vector<int>& local, const std::vector<std::vector<int>>& threadMasks) {
  std::set<int> allowed;
  for (const auto& m : threadMasks) allowed.insert(m.begin(), m.end());
  std::set<int> pinned;
  for (const auto& m : threadMasks) {
    if (!m.empty() && m.size() < allowed.size()) pinned.insert(m.begin(), m.end());
  }
  std::vector<int> out;
  for (int c : local) {
    if (allowed.count(c) != 0 && pinned.count(c) == 0) out.push_back(c);
  }
  return out;
}

bool bindThisThreadNear(int node, std::string* what) {
  if (node < 0) {
    *what = "no NUMA node to go near";
    return false;
  }
  if (!placementOn()) {
    *what = "placement off (WEFT_NUMA, or a one-node machine, or a layout not read from this system)";
    return false;
  }
  const topo::NumaNode* n = topo::Topology::host().numaNode(node);
  if (n == nullptr) {
    *what = fmt::format("NUMA node {} is not in this machine's layout", node);
    return false;
  }
  std::vector<std::vector<int>> masks;
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      const pid_t tid = static_cast<pid_t>(std::atoi(e->d_name));
      if (tid > 0 && tid != self) masks.push_back(affinityOf(tid));
    }
    closedir(d);
  }
  masks.push_back(affinityOf(0));  // this thread's own counts for what the process may use, not as pinned
  const std::vector<int> cpus = chooseCpus(n->cpus, masks);
  if (cpus.empty()) {
    *what = fmt::format("every cpu of NUMA node {} ({}) is outside this process's mask or pinned by another thread",
                        node, topo::cpuList(n->cpus));
    return false;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    *what = fmt::format("sched_setaffinity: {}", std::strerror(errno));
    return false;
  }
  *what = fmt::format("cpus {} (NUMA node {})", topo::cpuList(cpus), node);
  return true;
}

void setHomeNode(int node) { gHomeNode.store(node, std::memory_order_relaxed); }
int homeNode() { return gHomeNode.load(std::memory_order_relaxed); }

}  // namespace weft::numa

// SPDX-License-Identifier: Apache-2.0
// Host memory on a NIC's NUMA node, and weft's own threads on cores near it (docs/topology.md §placement).
//
// Memory: blocks carved from regions the kernel is asked to place on one node (mbind MPOL_PREFERRED: that node
// while it has room, another rather than failing), one free list per block size, so that the blocks of closed
// comms serve the next ones. For what lives as long as a comm: the comm itself, its chunks of requests, staging
// buffers; never per message (allocation takes a mutex). Regions stay mapped for the process's life (the peak is
// held, as with any free list).
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

namespace weft::numa {

// Whether weft places memory and binds threads: WEFT_NUMA (auto: on a machine of several NUMA nodes whose layout
// hwloc read from the running system; on: wherever the layout is this system's, even one node; off: never).
bool placementOn();

// `bytes` on `node` (-1, or placement off: the ordinary heap), aligned to 64 bytes; nullptr when there is no
// memory. A node the kernel refuses (not there, or mbind forbidden) falls back to the ordinary heap with one
// warning.
void* allocate(size_t bytes, int node) noexcept;
// Gives back a block from allocate() (nullptr: nothing).
void deallocate(void* p) noexcept;

// What the arena holds, for tests and `weft info`.
struct Stats {
  size_t regions = 0, regionBytes = 0;  // mapped for nodes
  size_t blocksInUse = 0, bytesInUse = 0;
  size_t fallbacks = 0;  // allocations on the ordinary heap because a node was refused
};
Stats stats();
// The node the kernel placed the page of `p` on (-1 when it cannot say): tests check placement by it.
int nodeOfPage(const void* p);
// The policy of the mapping holding `p`: "preferred 0", "default", ... (tests).
std::string policyOf(const void* p);

// An array of T on a node, freed (destructors run) by its deleter.
template <typename T>
struct ArrayDeleter {
  size_t n = 0;
  void operator()(T* p) const noexcept {
    if (p == nullptr) return;
    for (size_t i = n; i-- > 0;) p[i].~T();
    deallocate(p);
  }
};
template <typename T>
using ArrayPtr = std::unique_ptr<T[], ArrayDeleter<T>>;
// n value-initialised Ts on `node`; empty on no memory.
template <typename T>
ArrayPtr<T> makeArray(size_t n, int node) noexcept {
  void* p = allocate(n * sizeof(T), node);
  if (p == nullptr) return ArrayPtr<T>(nullptr, ArrayDeleter<T>{0});
  T* a = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) new (&a[i]) T();
  return ArrayPtr<T>(a, ArrayDeleter<T>{n});
}

// A class whose objects may live on a node: `numa::make<Comm>(node, args...)` places one there, plain `new` uses
// the ordinary heap, and `delete` (through a virtual destructor too: the size is the object's own) frees either.
struct Placed {
  static void* operator new(size_t bytes) {
    void* p = allocate(bytes, -1);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  static void operator delete(void* p) noexcept { deallocate(p); }
};
template <typename T, typename... Args>
T* make(int node, Args&&... args) {
  void* p = allocate(sizeof(T), node);
  if (p == nullptr) throw std::bad_alloc();
  try {
    return ::new (p) T(std::forward<Args>(args)...);
  } catch (...) {
    deallocate(p);
    throw;
  }
}

// ---- threads ----------------------------------------------------------------------------------------------------

// The cpus a weft thread meant for `local` cpus may run on: those of `local` that the process may use (the union of
// its threads' masks) and that no thread of the process is pinned to (a mask narrower than that union: the job's
// or NCCL's own binding). Empty: leave the thread where it is.
std::vector<int> chooseCpus(const std::vector<int>& local, const std::vector<std::vector<int>>& threadMasks);
// Binds the calling thread near NUMA node `node` by chooseCpus() over the process's threads now. Says what it did
// (or why not) in `what`; false when it left the thread as it was.
bool bindThisThreadNear(int node, std::string* what);

// The node weft's process-wide threads (the telemetry writer) go near: that of the first device the backend
// offers NCCL (-1 until a backend sets it).
void setHomeNode(int node);
int homeNode();

}  // namespace weft::numa

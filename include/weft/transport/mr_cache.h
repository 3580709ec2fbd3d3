// SPDX-License-Identifier: Apache-2.0
// Registration cache shared by all comms of one device. NCCL registers the same range many times (the p2p
// pool once per connection) and expects each call to get its own handle; sub-ranges of a registered range must
// be nearly free (regIsGlobal). A backend supplies the real registration through Registrar.
//
// Locking: mutex_ guards entries_ and the entries' refcounts; it is taken by regMr/deregMr (service thread,
// and the progress thread on 2.20-2.23 per registered p2p op), never by isend/irecv/test, which only read an
// immutable MemHandle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "weft/common/status.h"
#include "weft/transport/net.h"

namespace weft {

struct MrEntry {
  uintptr_t base = 0;
  size_t len = 0;
  int type = 0;
  int refs = 0;
  void* backendMr = nullptr;  // the backend's registration (e.g. fid_mr*)
  void* desc = nullptr;       // local descriptor for data-path calls (fi_mr_desc), may be NULL
  uint64_t key = 0;           // remote key, when the backend has one
};

class MemHandle : public Object {
 public:
  MemHandle() : Object(kMrMagic) {}
  MrEntry* entry = nullptr;
  uintptr_t addr = 0;
  size_t len = 0;
  int type = 0;
  bool cached = true;  // false: a one-off registration (DMA-BUF) owned by this handle alone
  // A device spanning several NICs registers the range once per NIC: the handle NCCL holds is rail 0's, and
  // chains the others (each owned by its own NIC's cache). Set before NCCL sees the handle, read-only after.
  MemHandle* nextRail = nullptr;
  void* desc() const { return entry ? entry->desc : nullptr; }
  const MemHandle* rail(int k) const {
    const MemHandle* h = this;
    while (k-- > 0 && h != nullptr) h = h->nextRail;
    return h;
  }
};

// The memory-handle check of every backend's data calls (`op`: isend, irecv, iflush; `device` names the comm's
// device), logged here: a NULL handle passes only where the backend reads any host memory (nullOk; else kInternal);
// anything else must be a live weft handle (else NCCL misused the API: kInternal), and the buffer [data, +size) must
// lie within what it registered (kInvalidUsage; data nullptr: not checked). A backend checks what is its own after.
Status checkMemHandle(const MemHandle* mh, const void* data, size_t size, const char* op, bool nullOk,
                      const std::string& device);

class Registrar {
 public:
  virtual ~Registrar() = default;
  // Registers [base, base+len) of memory `type` (NCCL_PTR_*); dmabufFd >= 0 for a DMA-BUF registration.
  virtual Status registerRange(uintptr_t base, size_t len, int type, int dmabufFd, uint64_t dmabufOffset,
                               MrEntry* entry) = 0;
  virtual void deregisterRange(MrEntry* entry) noexcept = 0;
};

class MrCache {
 public:
  explicit MrCache(Registrar* registrar, size_t pageSize = 4096) : registrar_(registrar), page_(pageSize) {}
  ~MrCache();
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  Status reg(void* data, size_t size, int type, MemHandle** out);
  Status regDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd, MemHandle** out);
  Status dereg(MemHandle* mh);

  struct Stats {
    uint64_t hits = 0, misses = 0, live = 0, handles = 0;
  };
  Stats stats() const;

 private:
  Registrar* registrar_;
  size_t page_;
  mutable std::mutex mutex_;  // guards entries_, stats_ and every MrEntry::refs
  std::multimap<uintptr_t, MrEntry*> entries_;  // by base address
  Stats stats_;
};

}  // namespace weft

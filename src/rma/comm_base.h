// SPDX-License-Identifier: Apache-2.0
// What every transport's RMA comm has in common: the window registry (by the id every rank gives the same window),
// the context blocks, the checks of every operation against them, the comm's first error, and the bounded wait of
// set-up calls. A transport derives from it and adds how bytes move (tcp/tcp_rma.h, fabric/fabric_rma.h).
//
// Locking: mu_ guards everything here and whatever the transport adds; the data path takes it (NCCL's proxy thread),
// test and progress only try it, set-up calls hold it while they move the transport (pumpAll) and release it between
// passes while they wait (waitFor).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "rma/rma.h"

namespace weft::rma {

class CommBase : public RmaComm {
 public:
  CommBase(int rank, int nranks, const DeviceProps& props) : rank_(rank), nranks_(nranks), props_(props) {}
  ~CommBase() override;
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  int maxRecvs() const override { return props_.maxRecvs; }
  bool hasError(std::string* why) const override;
  Status createContext(int nContexts, std::vector<int> peers, Context** out) override;
  // Moves every peer's traffic (pumpAll) if the comm is free; set-up holding it means "not now" (NCCL calls again).
  Status progress() override;

 protected:
  // An operation's arguments against the comm's contexts and windows and every rank's part of them (a warning
  // naming what is wrong; kInternal for a context NCCL never had, kInvalidUsage for the rest). Caller holds mu_.
  Status checkContext(Context* ctx, int context, uint32_t rank, const char* what) const;
  Status checkWindow(const Window* w, const char* what) const;
  Status checkPut(Context* ctx, int context, const Window* src, uint64_t srcOff, size_t size, const Window* dst,
                  uint64_t dstOff, uint32_t rank, const Signal* signal) const;
  Status checkGet(Context* ctx, int context, const Window* remote, uint64_t remoteOff, size_t size,
                  const Window* local, uint64_t localOff, uint32_t rank) const;
  // A registration's arguments (regMrSym), then a window for them, its id not yet given (addWindow does).
  Status newWindow(void* data, size_t size, int type, uint64_t flags, std::unique_ptr<Window>* out) const;
  // Gives the window the next id and keeps it (caller holds mu_); dropWindow forgets and frees it.
  void addWindow(Window* w);
  void dropWindow(Window* w);
  Window* windowById(uint32_t id) const;
  bool hasWindow(const Window* w) const;
  bool hasContext(const Context* c) const;
  void forgetContext(Context* c);  // erased and freed (caller holds mu_)
  // Sets the comm's first error (queryLastError) and warns once.
  void fail(const std::string& why, Status st);
  bool failed() const { return hasError_.load(std::memory_order_relaxed); }
  // Set-up calls (NCCL's service thread): runs pumpAll and `ready` under mu_ until ready says so, sleeping between
  // passes without the lock; kRemote after WEFT_CONNECT_TIMEOUT (a warning naming `what`).
  Status waitFor(const char* what, const std::function<bool()>& ready);
  // Moves every peer's traffic (caller holds mu_).
  virtual void pumpAll() = 0;
  // For the ledger's reader (a dump's thread): mu_, within about 100 ms. Meanwhile test and progress step aside (they
  // report "not yet", as when set-up holds the comm): NCCL's proxy calls them back to back and would hold it almost
  // always. false, unlocked, when set-up kept it.
  bool lockForLedger(std::unique_lock<std::mutex>* lock);
  // test and progress: a ledger reader waits for the lock.
  bool ledgerWaiting() const { return ledgerWants_.load(std::memory_order_relaxed) != 0; }

  const int rank_, nranks_;
  const DeviceProps props_;
  mutable std::mutex mu_;  // see the file comment
  std::vector<Window*> windows_;  // by id - 1; nullptr once deregistered
  uint32_t nextWindow_ = 1;
  std::vector<Context*> contexts_;
  bool cudaGetsSinceFlush_ = false;  // a get into GPU memory since the last flush: the next flush must wait for the NIC

 private:
  std::atomic<bool> hasError_{false};  // read without the lock (queryLastError)
  std::atomic<int> ledgerWants_{0};    // ledger readers waiting for mu_
  Status firstErrorStatus_ = Status::kOk;
  std::string firstError_;
};

}  // namespace weft::rma

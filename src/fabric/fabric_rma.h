// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over libfabric (WEFT_RMA, docs/device-api.md): one reliable-datagram endpoint per collective
// comm and device, shared by every context and window of the comm; a peer costs an address-vector entry and a few
// counters, never an endpoint or a connection of weft's own (a connection-oriented provider such as rxm opens one
// on first use, to the peers NCCL really talks to).
//
// - Listen opens the endpoint; its address goes in the handle, and connect inserts every rank's address at once.
//   connect and regMrSym are collective: every rank's hello and window record (provider key, address, size) travels
//   the ring of ranks (each forwards what its predecessor sent, until the record reaches the rank before its origin):
//   each rank talks to its two neighbours only, N - 1 messages of 64 bytes for a comm of N.
// - A put is an RMA write (fi_writemsg) carrying the initiator's rank as remote completion data; the target counts
//   the writes that landed from each peer. A put with a signal is the write, then a signal message that says how
//   many of the initiator's writes must have landed first: the target applies the signal (rma::applySignal) once
//   its count got there. That keeps a signal behind its own put and behind every earlier put to the same target
//   (every signal is strong), needs no atomics and no ordering of the provider's, and works where the target memory
//   is GPU memory. (Atomics on the signal word are the other way: see docs/device-api.md for why not by default.)
//   Except over rxm on tcp, which orders a send after the writes before it (FI_ORDER_SAW: one TCP stream a peer, a
//   write's bytes placed before the next message is read): there writes carry no completion data and a signal
//   applies on arrival, because a write with completion data whose connection breaks while it is being received
//   crashes libfabric there (1.17 and 2.1: tcp reports the failed target-side transfer with no context, and rxm's
//   error path, rxm_handle_comp_error, dereferences it). orderedSignals_ says which.
// - A get is an RMA read (fi_readmsg), done when its completion arrives.
// - A flush after gets into GPU memory reads back one word of the window through the NIC (the read completes after
//   the earlier writes the NIC made to that memory).
//
// Progress: manual where the provider allows it; NCCL's proxy calls test and progress, which read the endpoint's
// completion queue (so a target applies signals while its proxy runs, as NCCL's own proxies need too).
//
// Failures: an error completion fails its request and, for an error of the path to the peer, loses the peer (what
// waits on it fails, later operations to it fail at once). An operation the provider holds with no news from its
// peer for WEFT_PEER_TIMEOUT seconds loses the peer as well (a dead process behind shm, a host gone silent). A
// request that fails while the provider still holds its operation goes back to the pool only when the provider
// returns it (its completion context stays valid).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/fabric_device.h"
#include "fabric/fabric_raii.h"
#include "rma/comm_base.h"
#include "rma/op_pool.h"
#include "rma/provider_comm.h"
#include "rma/rma.h"

namespace weft::fabric {

// Every message of weft's own on an RMA endpoint (rma::RingMsg, 64 bytes), under one tag.
using RmaMsg = rma::RingMsg;
constexpr uint64_t kRmaMsgTag = 0x5746524d41000000ull;  // "WFRMA"

// An endpoint with its completion queue and address vector (opened by listen, taken over by connect).
struct RmaEndpoint {
  FabricDevice* dev = nullptr;
  // Acquisition order; destroyed in reverse (endpoint before its queues).
  CqPtr cq;
  AvPtr av;
  EpPtr ep;
  std::vector<uint8_t> name;
  bool sendAfterWrite = false;  // opened asking for FI_ORDER_SAW (rxm over tcp: fabric_rma.h's file comment)
  static Status open(FabricDevice& dev, int nranksHint, std::unique_ptr<RmaEndpoint>* out);
};

class FabricRmaTransport final : public rma::DeviceTransport<FabricDevice> {
 public:
  // The devices WEFT_PROVIDER and WEFT_IFACE select, with RMA reads and writes; nullptr and `why` when none.
  static std::unique_ptr<FabricRmaTransport> discover(std::string* why);
  const char* name() const override { return "libfabric"; }
  Status listen(int dev, void* handle, rma::RmaListen** out) override;
  Status connect(void* const* handles, int nranks, int rank, rma::RmaListen* listen, uint64_t commId,
                 rma::RmaComm** out) override;
};

class FabricRmaComm;

// A completion context: what the provider hands back (FI_CONTEXT2 storage first).
struct RmaCtx {
  fi_context2 fi{};
  enum : uint8_t { kData, kCtlSend, kCtlRecv } kind = kData;
  uint32_t slot = 0;       // control sends and receives: the slot
  void* owner = nullptr;   // kData: the RmaOp
};

// A request (put, get, flush) and the provider operations it waits for (the write or read, the signal message).
struct RmaOp : rma::ProviderOp {
  RmaCtx data;  // the write, read or read-back (the signal message has a control slot's)
};

// One peer: its address and what this comm knows of its traffic.
struct RmaPeer : rma::PeerState {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  uint64_t issued = 0;   // writes this rank posted to it
  uint64_t landed = 0;   // writes of its that landed here
  std::vector<RmaMsg> waitingSignals;  // its signals whose writes have not all landed yet
};

class FabricRmaComm final : public rma::ProviderCommOf<RmaOp> {
 public:
  FabricRmaComm(int rank, int nranks, uint64_t commId, std::unique_ptr<RmaEndpoint> ep);
  ~FabricRmaComm() override;
  // Set-up after construction (connect): addresses in, receives posted, the ring of hellos.
  Status start(const std::vector<std::vector<uint8_t>>& addrs);

  Status iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size, rma::Window* dst,
              uint64_t dstOff, uint32_t rank, const rma::Signal* signal, uint32_t optFlags, void** request) override;
  Status iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
              rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) override;
  Status iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) override;
  bool flushesAllPutsOnAnySignal() const override { return false; }
  void close() override { drainAndDelete(); }
  bool sendsAfterWrites() const { return orderedSignals_; }

 private:
  static constexpr int kCtlSlots = 256;  // control messages out and receives posted, each
  struct RmaRemote {
    uint64_t addr = 0, key = 0;
  };
  struct WindowReg {
    MrPtr mr;
    void* desc = nullptr;
    std::vector<RmaRemote> remote;  // by rank
  };
  struct Ctl {
    RmaMsg out[kCtlSlots];
    RmaMsg in[kCtlSlots];
    uint64_t flushSink;
  };
  struct Backlog {
    uint32_t peer;
    RmaMsg msg;
    RmaOp* owner;
    uint32_t ownerGen;
  };

  // rma::ProviderComm
  rma::PeerState& peer(uint32_t rank) override { return peers_[rank]; }
  Status registerWindow(rma::Window* w, int dmabufFd, uint64_t* addr, uint64_t* key) override;
  void forgetWindow(rma::Window* w) override { regs_.erase(w); }
  bool abandonProvider(const std::string& why) override;
  void setRemote(rma::Window* w, uint32_t rank, uint64_t addr, uint64_t key) override;
  void sendMsg(uint32_t peer, const RmaMsg& m) override { sendCtl(peer, m, nullptr); }
  bool sendsDrained() const override { return backlog_.empty() && ctlFree_.size() == static_cast<size_t>(kCtlSlots); }
  void onHello(const RmaMsg& m) override;
  void onSignal(const RmaMsg& m) override;
  void onLost(uint32_t peer) override { peers_[peer].waitingSignals.clear(); }

  void pumpAll() override;
  void readCompletions();
  // One RMA write (with this rank as remote completion data) or read of [local, +size) at rank's remoteAddr under
  // `key`, completing on op->data (one more pending). False when the provider refused it (or pushed back for
  // WEFT_PEER_TIMEOUT): the op failed, and the peer is lost (a read from this rank itself, a flush's: the comm's error).
  bool postRma(bool write, RmaOp* op, uint32_t rank, void* local, size_t size, void* desc, uint64_t remoteAddr,
               uint64_t key);
  void onCompletion(RmaCtx* c, bool ok, Status st, uint64_t flags, uint64_t data, size_t len, const std::string& err);
  void sendCtl(uint32_t peer, const RmaMsg& m, RmaOp* owner);
  void flushBacklog();
  bool postCtl(uint32_t peer, const RmaMsg& m, RmaOp* owner);
  Status postRecv(uint32_t slot);
  WindowReg* regOf(const rma::Window* w) const;

  std::unique_ptr<RmaEndpoint> ep_;
  FabricDevice& dev_;
  // Guarded by mu_ (CommBase).
  std::vector<RmaPeer> peers_;
  std::unique_ptr<Ctl> ctl_;
  MrPtr ctlMr_;
  void* ctlDesc_ = nullptr;
  RmaCtx ctlSendCtx_[kCtlSlots];
  RmaCtx ctlRecvCtx_[kCtlSlots];
  RmaOp* ctlOwner_[kCtlSlots] = {};
  uint32_t ctlOwnerGen_[kCtlSlots] = {};
  std::vector<uint32_t> ctlFree_;
  std::deque<Backlog> backlog_;
  std::vector<uint32_t> recvRepost_;  // control receives the provider pushed back
  std::unordered_map<const rma::Window*, std::unique_ptr<WindowReg>> regs_;
  uint32_t hellos_ = 0;  // other ranks' hellos seen
  size_t maxMsg_;
  bool inject_;  // control messages injected (the provider's inject size holds one; WEFT_RMA_INJECT)
  bool orderedSignals_;  // signals rely on the provider's send-after-write order (the file comment says where)
};

}  // namespace weft::fabric

// SPDX-License-Identifier: Apache-2.0
// The device API's RMA over native verbs (InfiniBand, RoCE; WEFT_RMA, docs/device-api.md).
//
// - Connect: the ranks form a ring of TCP sockets (each connects to the next rank's listen socket, the address in its
//   handle); every rank creates one reliable-connected QP per peer (itself included) on one completion queue, the
//   ring carries every rank's QP numbers, PSN and address round (an allgather), every QP moves to RTS, and a token
//   goes round the ring twice so that nobody sends before every QP is ready. The sockets close after connect. A peer
//   costs one QP (shared by every window and context of the comm), 64 receive buffers of 64 bytes and a few
//   counters.
// - Windows: regMrSym registers the memory (remote read, write and atomic access; GPU memory through DMA-BUF or the
//   peer-memory module as for the net table) and sends its record (address, rkey, size) to the next rank on its QP;
//   records travel the ring as over libfabric (each rank forwards what its predecessor sent).
// - Puts are RDMA writes, gets RDMA reads. A signal is, by WEFT_RMA_SIGNAL:
//   - atomic (default where the device has atomics): an RDMA fetch-and-add on the signal word, posted on the same QP
//     after the put's write. A reliable connection executes a peer's requests in order, so the add lands after the
//     put's bytes and after every earlier put to that target (every signal strong); the target's CPU takes no part.
//   - message: a 64-byte SEND after the write on the same QP; its receive completes after the write's bytes are
//     placed, and the target applies the signal from its progress (rma::applySignal: GPU memory through the driver).
// - A flush after gets into GPU memory reads one word of the window back through the rank's own QP.
//
// Failures: a completion error fails its request and loses the peer (its QP is in error); an asynchronous QP or port
// error loses the peers it concerns; an operation with no completion for WEFT_PEER_TIMEOUT loses its peer.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "rma/comm_base.h"
#include "rma/op_pool.h"
#include "rma/provider_comm.h"
#include "rma/rma.h"
#include "verbs/verbs_device.h"
#include "verbs/verbs_raii.h"

namespace weft::verbs {

// What the ring carries about each rank at connect.
struct VerbsRmaPeerInfo {
  uint32_t psn;
  uint16_t lid;
  uint8_t roce, mtu;
  uint8_t gid[16];
};

class VerbsRmaTransport final : public rma::DeviceTransport<VerbsDevice> {
 public:
  static std::unique_ptr<VerbsRmaTransport> discover(std::string* why);
  const char* name() const override { return "verbs"; }
  Status listen(int dev, void* handle, rma::RmaListen** out) override;
  Status connect(void* const* handles, int nranks, int rank, rma::RmaListen* listen, uint64_t commId,
                 rma::RmaComm** out) override;
};

struct RmaOp : rma::ProviderOp {
  // Work requests of it posted without a completion of their own (a put's write before its signal): the signal's
  // completion implies theirs on the same QP, and frees their send-queue room with its own.
  uint8_t quiet = 0;
};

class VerbsRmaComm final : public rma::ProviderCommOf<RmaOp>, public QpOwner {
 public:
  VerbsRmaComm(int rank, int nranks, uint64_t commId, VerbsDevice& dev);
  ~VerbsRmaComm() override;
  // Connect's steps after the ring of sockets: QPs created (described for the ring), then connected to every peer's.
  Status createQps(VerbsRmaPeerInfo* self, std::vector<uint32_t>* qpns);
  Status connectQps(const std::vector<VerbsRmaPeerInfo>& infos, const std::vector<std::vector<uint32_t>>& qpns);

  Status iput(rma::Context* ctx, int context, rma::Window* src, uint64_t srcOff, size_t size, rma::Window* dst,
              uint64_t dstOff, uint32_t rank, const rma::Signal* signal, uint32_t optFlags, void** request) override;
  Status iget(rma::Context* ctx, int context, rma::Window* remote, uint64_t remoteOff, size_t size,
              rma::Window* local, uint64_t localOff, uint32_t rank, uint32_t optFlags, void** request) override;
  Status iflush(rma::Context* ctx, int context, rma::Window* w, uint32_t rank, void** request) override;
  bool flushesAllPutsOnAnySignal() const override { return false; }
  void close() override { drainAndDelete(); }

 private:
  static constexpr int kRecvs = 64;  // control receives posted a peer
  static constexpr int kSendWr = 512;
  struct WindowReg {
    MrPtr mr;
    std::vector<std::pair<uint64_t, uint32_t>> remote;  // by rank: address, rkey
  };
  struct Peer : rma::PeerState {
    QpPtr qp;
    int sendsOut = 0;  // send work requests posted and not yet known complete
  };
  // wr_id: kind in the top 4 bits, then the op (index << 32 | gen), the receive slot, or the peer.
  enum : uint64_t { kWrOp = 1, kWrRecv = 2, kWrCtl = 3, kWrQuiet = 4 };

  // rma::ProviderComm
  rma::PeerState& peer(uint32_t rank) override { return peers_[rank]; }
  Status registerWindow(rma::Window* w, int dmabufFd, uint64_t* addr, uint64_t* key) override;
  void forgetWindow(rma::Window* w) override;
  void setRemote(rma::Window* w, uint32_t rank, uint64_t addr, uint64_t key) override;
  void sendMsg(uint32_t peer, const rma::RingMsg& m) override { sendCtl(peer, m, nullptr); }
  bool sendsDrained() const override;
  // The peer's NIC completes our work without its process: a silent peer is its link or its host.
  const char* stallHint(StallKind* kind) const override {
    *kind = StallKind::kLink;
    return "its NIC acknowledges nothing (it completes our work without its process): the link, or its host";
  }

  void pumpAll() override;
  void pollCq();
  void onWc(const ibv_wc& wc);
  Status postRecv(uint32_t peer, uint32_t slot);
  bool sendCtl(uint32_t peer, const rma::RingMsg& m, RmaOp* owner);
  Status postRdma(uint32_t peer, ibv_wr_opcode op, void* local, uint32_t lkey, size_t size, uint64_t remote,
                  uint32_t rkey, RmaOp* owner, bool signaled);
  void waitRoom(uint32_t rank, int wrs);  // room for wrs work requests on rank's QP, else (after the bound) rank lost

  // Members in acquisition order (verbs_raii.h): the CQ outlives the QPs on it, each MR its buffer's use.
  VerbsDevice& dev_;
  const bool atomics_;
  CqPtr cq_;
  // Guarded by mu_ (CommBase).
  std::vector<Peer> peers_;
  std::vector<rma::RingMsg> recvBuf_;  // kRecvs a peer
  MrPtr recvMr_;
  std::vector<rma::RingMsg> sendBuf_;  // kSendWr slots
  MrPtr sendMr_;
  uint32_t nextSend_ = 0;
  uint64_t scratch_[2] = {};  // where fetch-and-add and read-back flushes put what they read
  MrPtr scratchMr_;
  std::unordered_map<const rma::Window*, std::unique_ptr<WindowReg>> regs_;
  std::deque<std::pair<uint32_t, rma::RingMsg>> backlog_;  // messages waiting for send room
  int64_t asyncCheckMs_ = 0;  // when the device's asynchronous events were last read
};

}  // namespace weft::verbs

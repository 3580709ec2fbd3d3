// SPDX-License-Identifier: Apache-2.0
// What every operation weft hands libfabric carries (its context), and the interface through which a comm takes
// the completions routed to it (fabric/comm_table.h).
#pragma once

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>

#include "weft/common/status.h"

namespace weft::fabric {

class Endpoint;

// kData, kOfferSend, kFlush, kAck and kNote (a close notice or ack, wire.h) belong to a comm (delivered to its DataSink); the
// rest to the endpoint (kOfferRecv: its pool of offer receives, whose messages it hands to the comm they name;
// kProbeSend: its per-peer liveness; kProbeRecv: probes, and close notices and acks it hands to the comm named).
enum class OpKind : uint8_t {
  kData = 0,
  kOfferSend,
  kOfferRecv,
  kConnRequest,
  kConnReply,
  kCtrlSend,
  kProbeRecv,
  kProbeSend,
  kNote,
  kFlush,  // a receive comm's read-back flush (FabricRecvComm::iflush)
  kAck,    // a receive comm's delivery acknowledgement (wire::AckMsg)
};

struct OpContext {
  fi_context2 fi;  // first: libfabric is handed &fi
  void* owner = nullptr;
  uint32_t comm = 0;  // a comm's operation: that comm's id (where the dispatcher routes its completion)
  uint16_t index = 0;
  OpKind kind = OpKind::kData;
};

inline bool isCommOp(OpKind k) {
  return k == OpKind::kData || k == OpKind::kOfferSend || k == OpKind::kNote || k == OpKind::kFlush ||
         k == OpKind::kAck;
}

class DataSink {
 public:
  virtual ~DataSink() = default;
  virtual void onComplete(OpContext* ctx, size_t len) noexcept = 0;
  // fiErr: libfabric's error number (FI_ECANCELED for a canceled receive); st: its NCCL-facing status.
  // ep: the endpoint whose completion queue reported it (the operation's rail).
  virtual void onError(Endpoint* ep, OpContext* ctx, int fiErr, Status st) noexcept = 0;
  // An RMA write with remote completion data landed in one of our buffers.
  // len: the completion entry's length (0 where the provider does not report it).
  virtual void onRemoteData(uint64_t data, size_t len) noexcept = 0;
  // A buffer offer (wire::OfferMsg, `len` bytes) or delivery acknowledgement (wire::AckMsg: the same tag, pool
  // and naming) the peer sent to this comm; valid during the call only.
  virtual void onOffer(const void* msg, size_t len) noexcept {
    (void)msg;
    (void)len;
  }
  // Rail failover: the peer send comm moved the traffic of `rails` (bit per rail) to rail 0.
  virtual void onRailNote(uint32_t rails) noexcept { (void)rails; }
  // Rail re-admission: a wire::kRailUp note (its second word) the peer sent this comm on the rail of endpoint `ep`.
  virtual void onRailUp(Endpoint* ep, uint64_t word) noexcept {
    (void)ep;
    (void)word;
  }
  // Asked for through CommTable::defer: the batch of completions that asked is over.
  virtual void afterBatch() noexcept {}
  // The peer send comm closed and will write nothing more (wire::kWritesOver), said on the rail of endpoint `ep`.
  virtual void onWritesOver(Endpoint* ep) noexcept { (void)ep; }
  // A close notice (ack false) or close ack (true) the peer sent this comm on the rail of endpoint `ep`.
  virtual void onCloseNote(Endpoint* ep, bool ack) noexcept {
    (void)ep;
    (void)ack;
  }
};

}  // namespace weft::fabric

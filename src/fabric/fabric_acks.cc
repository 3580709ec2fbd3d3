// SPDX-License-Identifier: Apache-2.0
// Delivery acknowledgements (WEFT_DELIVERY_ACK): the receive side tells the sender which messages it took.
#include "fabric/fabric_comm.h"

#include "weft/common/clock.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <time.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::fabric {

// The messages taken and not yet acknowledged, up to AckMsg::kMaxKeys of them in one acknowledgement, on the control
// rail (where the sender's offer receives are), while a slot is free: a message taken is acknowledged at once, and
// those taken while every slot is in flight leave together when one completes.
void FabricDataComm::flushAcks() {
  if ((ackQ_.empty() && fenceOut_ == 0 && readmitOut_ == 0) || fatal_ != Status::kOk) return;
  if (dev_.injectSize() >= wire::AckMsg::bytes(1)) {
    while (!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) {
      if (!postAck()) return;
    }
    return;
  }
  if (!ackMsg_) {
    ackMsg_ = numa::makeArray<wire::AckMsg>(kAckSlots, pool_.node());
    if (!ackMsg_) return;  // tried again at the next progress call
    if (Status st = dev_.registerInternal(ackMsg_.get(), sizeof(wire::AckMsg) * kAckSlots,
                                          "acknowledgement buffers", &ackMr_, &ackDesc_);
        st != Status::kOk) {
      fatal_ = st;
      return;
    }
  }
  while ((!ackQ_.empty() || fenceOut_ != 0 || readmitOut_ != 0) && ackBusy_ != (1u << kAckSlots) - 1) {
    if (!postAck()) return;
  }
}

bool FabricDataComm::postAck() {
  const size_t injectMax = dev_.injectSize();
  const bool inject = injectMax >= wire::AckMsg::bytes(1);
  wire::AckMsg local;
  const int slot = inject ? -1 : std::countr_one(ackBusy_);
  wire::AckMsg& m = inject ? local : ackMsg_[slot];
  const bool readmit = readmitOut_ != 0;
  const int rk = readmit ? std::countr_zero(readmitOut_) : 0;  // the rail re-admitted
  size_t most = wire::AckMsg::kMaxKeys;
  if (inject) most = std::min(most, (injectMax - offsetof(wire::AckMsg, key)) / sizeof(uint64_t) - (readmit ? 1 : 0));
  const int n = static_cast<int>(std::min(ackQ_.size(), most));
  m.magic = wire::AckMsg::kMagic;
  m.count = static_cast<uint8_t>(n);
  // The fence rides on the acknowledgement that empties the queue: every message taken before it comes with it.
  // A re-admission rides on the first one: never after a fence of the same rail (the sender takes the re-admission
  // first, then the fence).
  m.fenced = static_cast<size_t>(n) == ackQ_.size() ? fenceOut_ : 0;
  m.epoch = ctlEpoch_;
  m.readmit = static_cast<uint8_t>(readmit ? rk + 1 : 0);
  m.toComm = peerId_;
  m.alias = readmit ? railComm_[rk] : 0;
  std::copy(ackQ_.begin(), ackQ_.begin() + n, m.key);
  if (readmit) m.key[n] = switchAt_[rk];
  const size_t bytes = wire::AckMsg::bytes(n, readmit);
  const int on = ctlRail_;
  ssize_t rc = inject ? fi_tinject(ctl().ep(), &m, bytes, ctlPeer(), wire::ctrlTag(wire::CtrlKind::kOffer))
                      : fi_tsend(ctl().ep(), &m, bytes, ackDesc_, ctlPeer(), wire::ctrlTag(wire::CtrlKind::kOffer),
                                 &ackCtx_[slot].fi);
  if (rc == -FI_EAGAIN || railDownWait(on, rc)) return false;  // the next progress call (or completion) tries again
  if (rc != 0) {
    WEFT_WARN("comm with {}: sending a delivery acknowledgement on {} failed: {}", peerName_, railName(on),
              fi_strerror(static_cast<int>(-rc)));
    fatal_ = statusOfFiError(static_cast<int>(-rc));
    return false;
  }
  unreachableSinceMs_[on] = 0;
  if (!inject) ackBusy_ |= static_cast<uint8_t>(1u << slot);
  ++acksSent_;
  acksTaken_ += static_cast<uint64_t>(n);
  ackQ_.erase(ackQ_.begin(), ackQ_.begin() + n);
  fenceOut_ &= static_cast<uint8_t>(~m.fenced);
  if (readmit) readmitOut_ &= static_cast<uint8_t>(~(1u << rk));
  return true;
}

// Each key names a send of this comm in flight (the receiver took it); one naming none (its request failed and
// went back to the pool) is counted and dropped. A malformed acknowledgement is a protocol violation.
void FabricDataComm::onAck(const wire::AckMsg& m, size_t len) {
  if (!proto_.acks || m.count > wire::AckMsg::kMaxKeys || len < wire::AckMsg::bytes(m.count, m.readmit != 0)) {
    WEFT_WARN("peer {} on {} sent a malformed (or unagreed) delivery acknowledgement: connection closed for safety",
              peerName_, dev_.props().name);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if (proto_.failover) {  // one sent before the receiver's control rail moved, arriving late: had again since
    const auto ahead = static_cast<uint8_t>(m.epoch - ctlEpoch_);
    if (ahead >= 128) {
      ++strayAcks_;
      return;
    }
    ctlEpoch_ = m.epoch;
  }
  acksSent_ += 1;
  acksTaken_ += m.count;
  for (int j = 0; j < m.count; ++j) {
    const uint64_t key = m.key[j];
    bool found = false;
    for (int i = 0; i < allocated() && !found; ++i) {
      FabricSendRequest& r = asSend(&req(i));
      if (r.magic_ != kRequestMagic || !r.needAck || r.acked || r.ackKey != key) continue;
      r.acked = true;
      if (r.sent) r.doneBufs = 1;
      found = true;
    }
    if (!found) ++strayAcks_;
  }
  if (m.readmit != 0) {
    const int k = m.readmit - 1;
    const uint64_t at = m.key[m.count];
    const bool again = k < nRails_ && (failed_ & (1u << k)) == 0 && railComm_[k] == m.alias && switchAt_[k] == at;
    if (!proto_.failover || k >= nRails_ || ((failed_ & (1u << k)) == 0 && !again) || m.alias == 0 ||
        m.alias > wire::kMaxCommId) {
      WEFT_WARN("peer {} on {} re-admitted a rail it cannot (rail {}, alias {}): connection closed for safety",
                peerName_, dev_.props().name, k, m.alias);
      if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
      return;
    }
    // By construction this end cannot have reached the threshold yet (fabric_comm.h): a message at or beyond it
    // already sent on the control rail would wait there for a receive posted on the rail.
    if (!again && seqs_.maxNext() > at) {
      WEFT_WARN("comm with {}: the peer re-admitted {} from message {}, but messages up to {} have left on {}: "
                "connection closed for safety", peerName_, railName(k), at, seqs_.maxNext() - 1, railName(ctlRail_));
      if (fatal_ == Status::kOk) fatal_ = Status::kInternal;
      return;
    }
    if (!again) admitRail(k, m.alias, at, true);  // (again: said once more after the control rail moved)
  }
  if ((m.fenced >> nRails_) != 0 || (m.fenced != 0 && !proto_.failover)) {
    WEFT_WARN("peer {} on {} fenced a rail it cannot (rails {:#x}): connection closed for safety", peerName_,
              dev_.props().name, m.fenced);
    if (fatal_ == Status::kOk) fatal_ = Status::kRemote;
    return;
  }
  if (m.fenced != 0) {
    resendFenced(m.fenced);
    fencedIn_ |= m.fenced;
  }
}

}  // namespace weft::fabric

// SPDX-License-Identifier: Apache-2.0
// Re-admission of a failed-over rail (docs/failover.md, "Recovery"): a health check on the rail, then both ends
// agree from which message on it carries traffic again.
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

// Send side, when rail k fails over: the first try after WEFT_RAIL_READMIT, or after twice the last wait when the rail
// fails again within a minute of being taken back (a flapping rail is tried less and less often, up to 30 s).
void FabricDataComm::readmitSchedule(int k, int64_t nowMs) {
  Readmit& r = readmit_[k];
  int64_t wait = readmitFirstMs_;
  if (r.admittedMs != 0 && nowMs - r.admittedMs < 60000) wait = std::min(std::max(r.waitMs * 2, wait), kReadmitMaxMs);
  r.waitMs = wait;
  r.state = Readmit::kIdle;
  r.nextMs = nowMs + wait;
}

// The hello and its answer go on the rail itself, the rest on the control rail.
bool FabricDataComm::sendRailUp(int k, wire::RailUpStep step, uint16_t attempt) {
  const int on = step == wire::kRailHello || step == wire::kRailHelloAck ? k : ctlRail_;
  return injectNote(on, wire::kRailUp, wire::railUpWord(peerId_, k, step, attempt)) == 0;
}

// Send side, from progress while a fenced rail waits: see fabric_comm.h.
void FabricDataComm::readmitStep(int64_t nowMs) {
  if (fatal_ != Status::kOk || readmitFirstMs_ <= 0) return;
  for (int k = 0; k < nRails_; ++k) {
    const auto bit = static_cast<uint8_t>(1u << k);
    if ((failed_ & fencedIn_ & bit) == 0) continue;
    Readmit& r = readmit_[k];
    auto later = [&] {  // this try failed: the next one waits twice as long
      r.waitMs = std::min(std::max(r.waitMs * 2, readmitFirstMs_), kReadmitMaxMs);
      r.nextMs = nowMs + r.waitMs;
      r.state = Readmit::kIdle;
      WEFT_INFO(NCCL_NET, "comm with {}: {} not taken back yet; next try in {} ms", peerName_, railName(k), r.waitMs);
    };
    switch (r.state) {
      case Readmit::kIdle:
        if (nowMs < r.nextMs) break;
        if (rails_[k].ep->linkDownForMs(nowMs) > 0) {  // its link is still down: looked at again shortly
          r.nextMs = nowMs + 100;
          break;
        }
        {
          // The rail's connection as the failure left it may be dead for good (a QP in the error state, which rxm
          // keeps): closed first, unless another comm to the peer closed it since (that one's new connection is
          // fresh, and other comms may be using it).
          Endpoint& ep = *rails_[k].ep;
          if (resetRails_ && r.againSinceMs == 0 && ep.resetGen(rails_[k].peer) == r.resetGen) {
            if (Status st = ep.resetPeer(rails_[k].peer); st != Status::kOk) {
              later();
              break;
            }
          }
          r.resetGen = ep.resetGen(rails_[k].peer);
          const ssize_t rc = injectNote(k, wire::kRailUp, wire::railUpWord(peerId_, k, wire::kRailHello, r.attempt + 1));
          if (rc == 0) {
            ++r.attempt;
            r.state = Readmit::kHello;
            r.sentMs = nowMs;
            r.againSinceMs = 0;
          } else if (rc == -FI_EAGAIN && (r.againSinceMs == 0 || nowMs - r.againSinceMs < peerTimeoutMs_)) {
            // The provider is opening a new connection on the rail (its old one was closed): shortly again.
            if (r.againSinceMs == 0) r.againSinceMs = nowMs;
            r.nextMs = nowMs + 10;
          } else {
            WEFT_INFO(NCCL_NET, "comm with {}: the health check of {} could not be sent: {}", peerName_, railName(k),
                      fi_strerror(static_cast<int>(-rc)));
            r.againSinceMs = 0;
            later();
          }
        }
        break;
      case Readmit::kHello:  // no answer on the rail within a probe interval (at least 1 s)
        if (nowMs - r.sentMs > std::max<int64_t>(probeIntervalMs_, 1000)) later();
        break;
      case Readmit::kHelloAcked:
        if (sendRailUp(k, wire::kRailReady, r.attempt)) {
          r.state = Readmit::kReady;
          r.sentMs = nowMs;
        }
        break;
      case Readmit::kReady:  // the receiver did not take it (it may not: no id free); its answer, if late, holds
        if (nowMs - r.sentMs > peerTimeoutMs_) later();
        break;
    }
  }
}

// Both ends: from now on rail k carries the messages of count `at` and beyond (the tags under `alias`).
void FabricDataComm::admitRail(int k, uint32_t alias, uint64_t at, bool sendSide) {
  const int64_t now = coarseNowMs();
  const auto bit = static_cast<uint8_t>(1u << k);
  failed_ &= static_cast<uint8_t>(~bit);
  fencedIn_ &= static_cast<uint8_t>(~bit);
  resetWant_ &= static_cast<uint8_t>(~bit);
  senderStopped_ &= static_cast<uint8_t>(~bit);
  switchAt_[k] = at;
  railComm_[k] = alias;
  unreachableSinceMs_[k] = 0;
  Readmit& r = readmit_[k];
  r.state = Readmit::kIdle;
  r.admittedMs = now;
  RailHealth::bump(health_[k].readmits, 1);
  health_[k].msgsAtReadmit.store(health_[k].msgs.load(std::memory_order_relaxed), std::memory_order_relaxed);
  Endpoint::countRailReadmit();
  if (!health_[k].isUp()) railUp(k, now);
  try {
    WEFT_INFO(NCCL_NET, "comm with {}: {} taken back ({}): messages from number {} of each tag travel on it again",
              peerName_, railName(k), sendSide ? "the receiver agreed" : "the sender asked", at);
  } catch (...) {
  }
}

void FabricDataComm::onRailUp(Endpoint* ep, uint64_t word) noexcept {
  silence_.completed();
  const int k = wire::railUpRail(word);
  const uint8_t step = wire::railUpStep(word);
  const uint16_t attempt = wire::railUpAttempt(word);
  if (!proto_.failover || k < 0 || k >= nRails_) {
    WEFT_WARN("peer {} on {} sent a rail re-admission note this connection did not agree to (rail {}): ignored",
              peerName_, dev_.props().name, k);
    return;
  }
  const bool onRail = ep == rails_[k].ep;
  const bool onCtl = (failed_ & (1u << railOfEndpoint(ep))) == 0 && !onRail;  // a rail both ends still use
  const auto bit = static_cast<uint8_t>(1u << k);
  if (recvSide_) {
    // Only a rail this end failed over and fenced, and not while it still announces a re-admission.
    // rdma: and not before its connection was reset (resetStep).
    const bool ready = readmitFirstMs_ > 0 && (failed_ & bit) != 0 && (fencing_ & bit) == 0 &&
                       (resetWant_ & bit) == 0 && fatal_ == Status::kOk;
    if (step == wire::kRailHello && onRail) {
      const ssize_t rc =
          ready ? injectNote(k, wire::kRailUp, wire::railUpWord(peerId_, k, wire::kRailHelloAck, attempt)) : 1;
      if (rc != 0) {  // the sender tries again later
        WEFT_INFO(NCCL_NET, "comm with {}: health check {} of {} not answered ({})", peerName_, attempt, railName(k),
                  ready ? fi_strerror(static_cast<int>(-rc)) : "not ready to take the rail back yet");
      }
    } else if (step == wire::kRailReady && onCtl) {
      if (!ready || readmitOut_ != 0) return;
      if (aliases_.size() >= 64) {  // a rail that keeps failing stays failed over (each try retires an id)
        WEFT_INFO(NCCL_NET, "comm with {}: {} re-admitted {} times: it stays failed over", peerName_, railName(k),
                  aliases_.size());
        return;
      }
      CommId alias;
      try {
        alias = railAliasId();
        aliases_.reserve(aliases_.size() + 1);
      } catch (...) {
        return;
      }
      if (!alias) return;  // no id free: the sender tries again later
      const uint64_t at = seqs_.maxNext() + kMostSends;
      admitRail(k, alias.get(), at, false);
      aliases_.push_back(std::move(alias));
      readmitOut_ |= bit;
      flushAcks();
    }
    return;
  }
  Readmit& r = readmit_[k];
  if (step == wire::kRailHelloAck && onRail && r.state == Readmit::kHello && attempt == r.attempt) {
    r.state = Readmit::kHelloAcked;
    if (sendRailUp(k, wire::kRailReady, r.attempt)) {  // else from progress
      r.state = Readmit::kReady;
      r.sentMs = coarseNowMs();
    }
  }
}

}  // namespace weft::fabric

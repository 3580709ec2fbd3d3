// SPDX-License-Identifier: Apache-2.0
// Watching a data comm's rails and its peer: links going down and back up, probes of a silent peer.
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

// A send or write the provider refused at once because the rail's NIC has no route (its link is down: the
// kernel drops the interface's routes, and rxm's connection attempt fails with it) is pushed back, as for
// FI_EAGAIN, while the link has been down for less than WEFT_PEER_TIMEOUT: a flap is ridden out, as for what was
// already in flight on the rail. True: wait (the rail is marked down); false: the error stands.
bool FabricDataComm::railDownWait(int k, ssize_t rc) {
  if (rc != -FI_ENETUNREACH && rc != -FI_EHOSTUNREACH) return false;
  const int64_t now = coarseNowMs();
  // Measured from the first refusal (the link may be back already while the route, or the provider's
  // connection, is not): a later post that the provider takes ends the wait (unreachableSinceMs_ cleared).
  if (unreachableSinceMs_[k] == 0) unreachableSinceMs_[k] = now;
  if (health_[k].isUp()) {  // (NCCL posts again at once: the line is formatted only for the transition)
    railDown(k, RailEvent::kLinkDown, fmt::format("a send found no route to the peer ({})",
                                                  fi_strerror(static_cast<int>(-rc))));
  }
  // Failed over: pushed back, and posted again (by NCCL, or from test()) on the control rail.
  if (failRail(k, RailEvent::kLinkDown, "a send found no route to the peer")) return true;
  return now - unreachableSinceMs_[k] <= peerTimeoutMs_;
}

// Counted on the rail and in the process (weftNetStat "fabric.rail_downs"), reported once per transition. The
// first comm of an endpoint to see its NIC go down (or come back) warns; the others of the same endpoint (a shared
// one carries every comm of its context) say it at INFO: one NIC flapping under thousands of connections is a few
// lines, not thousands.
void FabricDataComm::railDown(int k, RailEvent why, const std::string& detail) {
  if (!health_[k].markDown(why)) return;
  ++railsDown_;
  railDownSinceMs_[k] = coarseNowMs();
  Endpoint::countRailDown();
  const std::string line = fmt::format(
      "comm with {}: {} is down ({}: {}); {} requests outstanding{}", peerName_, railName(k), railEventName(why),
      detail, outstanding_,
      proto_.failover               ? "; its traffic moves to another rail while one is left (WEFT_RAIL_FAILOVER)"
      : why == RailEvent::kLinkDown ? "; weft does not move traffic off a failed rail yet (docs/failover.md): the "
                                      "comm fails unless the link comes back within WEFT_PEER_TIMEOUT"
                                    : "");
  if (rails_[k].ep->noteLinkReport(false)) {
    WEFT_WARN("{} (other comms on this NIC: INFO lines)", line);
  } else {
    WEFT_INFO(NCCL_NET, "{}", line);
  }
}

void FabricDataComm::railUp(int k, int64_t nowMs) {
  if (!health_[k].markUp()) return;
  --railsDown_;
  Endpoint::countRailRecovery();
  const std::string line =
      fmt::format("comm with {}: {} is back up after {} ms", peerName_, railName(k), nowMs - railDownSinceMs_[k]);
  if (rails_[k].ep->noteLinkReport(true)) {
    WEFT_WARN("{}", line);
  } else {
    WEFT_INFO(NCCL_NET, "{}", line);
  }
  railDownSinceMs_[k] = 0;
}

// Requests have been outstanding with nothing completing. A live peer may simply be busy (NCCL posts receives
// long before the data comes), so silence alone proves nothing: after WEFT_PROBE_INTERVAL ms of it, the peer is
// probed (per peer address, by the endpoint: every comm to one peer shares the probes). A live peer's host takes
// a probe at once, whatever its process is doing; a dead process answers with a connection error (reported by
// the provider on the probe's completion); a probe the provider cannot even hand over within WEFT_PEER_TIMEOUT
// means the host or the link is gone.
// A rail seen down for its link comes back when its link does, whether or not traffic stalls meanwhile: looked at
// from checkPeer, from progress while a rail is down (every 256 calls; sysfs is read at most every 100 ms per
// endpoint), and at close.
void FabricDataComm::recheckRails(int64_t nowMs, bool fresh) {
  for (int k = 0; k < nRails_; ++k) {
    if (!health_[k].isUp() && health_[k].lastDownEvent() == RailEvent::kLinkDown &&
        rails_[k].ep->linkDownForMs(nowMs, fresh) == 0)
      railUp(k, nowMs);
  }
}

void FabricDataComm::checkPeer() {
  if (fatal_ != Status::kOk) return;
  int64_t now = coarseNowMs();
  if (railsDown_ > 0) recheckRails(now);
  if (busyEpoch_ != stallEpoch_) {  // busy again after nothing was outstanding: a stall starts no earlier
    stallEpoch_ = busyEpoch_;
    stallFromMs_ = now;
  }
  if (silence_.restarted(now)) {  // something completed since the last look
    if (stall_.over()) WEFT_INFO(NCCL_NET, "comm with {}: requests complete again", peerName_);
    return;
  }
  if (now - silence_.sinceMs() < probeIntervalMs_) return;

  // Stalled past the probe interval: a NIC whose link is down (its own cable, or for a veth the peer end) fails
  // the connection once it has stayed down for WEFT_PEER_TIMEOUT. A probe cannot show that over TCP: it is
  // "delivered" into the socket buffer and retransmitted for minutes. (The endpoint reads sysfs at most every
  // 100 ms, whatever the number of comms.)
  // A rail whose link is seen down is marked down at once (and up again if it returns before the timeout).
  for (int k = 0; k < nRails_; ++k) {
    if ((failed_ & (1u << k)) != 0) continue;  // failed over: nothing of this comm waits on it
    int64_t down = rails_[k].ep->linkDownForMs(now);
    if (down == 0) continue;  // (a rail back up was seen above)
    if (health_[k].isUp()) railDown(k, RailEvent::kLinkDown, fmt::format("its link has been down for {} ms", down));
    if (failRail(k, RailEvent::kLinkDown, fmt::format("its link has been down for {} ms", down))) continue;
    if (down > peerTimeoutMs_) {
      WEFT_WARN("peer {} unreachable: the link of {} has been down for {} s with {} requests outstanding; they fail "
                "(WEFT_PEER_TIMEOUT)", peerName_, railName(k), down / 1000, outstanding_);
      stall_.lostPeer(StallKind::kLink);
      fatal_ = Status::kRemote;
      return;
    }
  }
  // Every rail is probed: a link down on one NIC of a device stalls the messages that rail carries. A probe may
  // wait behind this comm's sends in flight: its deadline grows with their bytes (bytesInFlight_).
  const int64_t probeDeadlineMs = peerTimeoutMs_ + static_cast<int64_t>(bytesInFlight_ / floorBytesPerMs_);
  for (int k = 0; k < nRails_; ++k) {
    if ((failed_ & (1u << k)) != 0) continue;
    Rail& rail = rails_[k];
    Status why = Status::kOk;
    switch (rail.ep->checkPeer(rail.peer, silence_.sinceMs(), now, probeIntervalMs_, probeDeadlineMs, &why)) {
      case Endpoint::PeerVerdict::kOk: break;
      case Endpoint::PeerVerdict::kGone:
        railDown(k, RailEvent::kPeerGone, "a liveness probe failed");
        if (failRail(k, RailEvent::kPeerGone, "a liveness probe failed")) break;  // the last rail's answers for the peer
        WEFT_WARN("peer {} on {} is gone: a liveness probe failed after {} ms without progress (process exited or "
                  "was killed, or the connection broke); its {} outstanding requests fail{}",
                  peerName_, railName(k), now - silence_.sinceMs(), outstanding_, retriedSend());
        (void)why;  // the provider's error was logged with the completion; NCCL sees a remote failure
        stall_.lostPeer();
        fatal_ = Status::kRemote;
        return;
      case Endpoint::PeerVerdict::kUnreachable:
        railDown(k, RailEvent::kProbeLost, "a liveness probe was not delivered");
        if (failRail(k, RailEvent::kProbeLost, "a liveness probe was not delivered")) break;
        WEFT_WARN("peer {} on {} unreachable: a liveness probe was not delivered within {} s (host down, link "
                  "down, or traffic filtered); its {} outstanding requests fail{} (WEFT_PEER_TIMEOUT{})",
                  peerName_, railName(k), probeDeadlineMs / 1000, outstanding_, retriedSend(),
                  bytesInFlight_ > 0 ? fmt::format(", and time for the {} bytes queued ahead of the probe",
                                                   bytesInFlight_)
                                     : std::string());
        stall_.lostPeer();
        fatal_ = Status::kRemote;
        return;
    }
  }
  // No probe failed: a peer that is behind, not a dead one (those fail above). Said once a probe sent during this
  // quiet spell was taken (the peer is reachable), or, where none was taken yet (a provider that delivers in order
  // keeps it behind the waiting message), two probe intervals later with that said.
  // Sends in flight get the time their bytes take at 1% of the NIC's speed first (a large message shows no
  // completion until it is all there).
  const int64_t quiet = now - std::max(silence_.sinceMs(), stallFromMs_);
  const int64_t due = stallMs_ + static_cast<int64_t>(bytesInFlight_ / floorBytesPerMs_);
  if (stallMs_ > 0 && !stall_.reported && quiet >= due &&
      (rails_[0].ep->probeDeliveredMs(rails_[0].peer) >= now - quiet || quiet >= due + 2 * probeIntervalMs_)) {
    reportStall(now, quiet);
  }
}

// What a stalled comm waits for (docs/hangs.md). The provider reports no partial progress, so "nothing completed"
// is all there is to say of the bytes; the probes say whether the peer is reachable.
void FabricDataComm::reportStall(int64_t nowMs, int64_t quietMs) {
  Endpoint::countStall();
  const int n = std::max(outstanding_, waitingPeer_ ? 1 : 0);
  // A rail seen down (its link, a route, a probe lost) is where the bytes stopped, whatever probes said before it.
  for (int k = 0; k < nRails_; ++k) {
    if (health_[k].isUp()) continue;
    stall_.begin(nowMs - quietMs, StallKind::kLink);
    WEFT_WARN("comm with {} on {}: stalled, nothing completed for {} s: {} {}{} wait; the bytes stopped on the way: "
              "{} has been down for {} ms ({}): the link, or a host on it; the comm fails unless it comes back within "
              "WEFT_PEER_TIMEOUT (WEFT_STALL_S; docs/hangs.md)",
              peerName_, railName(0), quietMs / 1000, n, recvSide_ ? "receive" : "send", n == 1 ? "" : "s",
              railName(k), nowMs - railDownSinceMs_[k],
              railEventName(static_cast<RailEvent>(health_[k].lastDown.load(std::memory_order_relaxed))));
    return;
  }
  const int64_t took = rails_[0].ep->probeDeliveredMs(rails_[0].peer);
  const bool taken = took >= nowMs - quietMs;
  stall_.begin(nowMs - quietMs, taken ? StallKind::kBehind : StallKind::kOther);
  const std::string reach =
      taken ? fmt::format("the peer is reachable (it took a liveness probe {} ms ago), so", nowMs - took)
            : std::string("no liveness probe was taken yet (this provider may keep it behind the waiting messages; "
                          "an unreachable peer fails the comm after WEFT_PEER_TIMEOUT), so most likely");
  // One sentence for every side and protocol; only what the requests wait for differs.
  const char* waits = recvSide_     ? "wait and nothing has come for them"
                      : proto_.rdma ? "wait for the peer to offer its buffer"
                                    : "wait for the peer to take them";
  // The rdma protocol's sends wait on an offer, which is small: a large message in flight cannot be the reason.
  const char* inFlight = !recvSide_ && proto_.rdma ? ""
                         : " (or a message larger than the link carries in WEFT_STALL_S is still in flight: the "
                           "provider reports no partial progress)";
  const std::string what = fmt::format("{} {}{} {}; {} it has not posted the {}{}", n, recvSide_ ? "receive" : "send",
                                       n == 1 ? "" : "s", waits, reach, recvSide_ ? "matching send" : "receive",
                                       inFlight);
  WEFT_WARN("comm with {} on {}: stalled, nothing completed for {} s: {}: that rank is behind (in compute, or waiting "
            "on another rank: its own stall lines say on whom) (WEFT_STALL_S; docs/hangs.md)",
            peerName_, railName(0), quietMs / 1000, what);
}

}  // namespace weft::fabric

// SPDX-License-Identifier: Apache-2.0
// The health of one NIC (rail) of a multi-rail connection, as that connection saw it: whether it is up, how often
// it went down and came back, why it last went down, and what the connection sent on it. Kept by a backend's comm
// (its progress thread is the only writer) and read by the layer above from another thread (connection records,
// the Prometheus file): relaxed atomics, stored without read-modify-write, which on x86 are the plain loads and
// stores the counters cost before.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

namespace weft {

// Why a rail was last seen down.
enum class RailEvent : uint8_t {
  kNone = 0,
  kLinkDown,         // the NIC's link (its sysfs operstate or port state) went down
  kErrorCompletion,  // an operation of the connection on this rail completed with an error
  kProbeLost,        // a liveness probe on this rail was not delivered within WEFT_PEER_TIMEOUT
  kPeerGone,         // a liveness probe on this rail failed (the peer, or the way to it, is gone)
};

inline const char* railEventName(RailEvent e) {
  switch (e) {
    case RailEvent::kNone: return "none";
    case RailEvent::kLinkDown: return "link_down";
    case RailEvent::kErrorCompletion: return "error_completion";
    case RailEvent::kProbeLost: return "probe_lost";
    case RailEvent::kPeerGone: return "peer_gone";
  }
  return "unknown";
}

// What a stall line found (docs/hangs.md), for the dumps `weft report --hangs` joins across ranks.
enum class StallKind : uint8_t {
  kNone = 0,
  kBehind = 1,    // the peer is reachable and alive but has not posted its side: that rank is behind
  kLink = 2,      // bytes stopped on the way (mid-message, unacknowledged, keepalives unanswered, link or route gone)
  kOther = 3,     // stalled, cause not told apart (a full socket, a provider that reports no partial progress)
  kPeerGone = 4,  // the comm failed: the peer closed its end or answered nothing for WEFT_PEER_TIMEOUT
};
inline const char* stallKindName(StallKind k) {
  switch (k) {
    case StallKind::kNone: return "";
    case StallKind::kBehind: return "peer_behind";
    case StallKind::kLink: return "link";
    case StallKind::kOther: return "other";
    case StallKind::kPeerGone: return "peer_gone";
  }
  return "";
}

// A connection's stalls (WEFT_STALL_S, docs/hangs.md): written by its backend when a stall is reported and when bytes
// move again (never per message), read by anyone (the Prometheus file, the connection's record).
struct StallState {
  std::atomic<uint64_t> stalls{0};   // stall episodes reported
  std::atomic<int64_t> sinceMs{0};   // coarse clock (weft/common/clock.h) when the current one began; 0: none
  std::atomic<uint8_t> kind{0};       // StallKind of the current stall, or why the comm failed for its peer; kNone
  std::atomic<uint32_t> peerLost{0};  // 1 once the comm failed for its peer or link (then kind stays)
  bool reported = false;             // the comm's own thread only: a stall line was written and the stall goes on
  // The comm's thread, as it writes its stall line.
  void begin(int64_t fromMs, StallKind k = StallKind::kOther) {
    reported = true;
    stalls.store(stalls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    sinceMs.store(fromMs > 0 ? fromMs : 1, std::memory_order_relaxed);
    if (peerLost.load(std::memory_order_relaxed) == 0) kind.store(static_cast<uint8_t>(k), std::memory_order_relaxed);
  }
  // The comm's thread, as the comm fails because of its peer (closed, silent past WEFT_PEER_TIMEOUT), or of its link
  // (kLink: down past WEFT_PEER_TIMEOUT).
  // A stall already found the bytes stopped on the way keeps that name: the peer was lost over that link (or its
  // host went silent: "the link, or a host on it").
  void lostPeer(StallKind why = StallKind::kPeerGone) {
    if (why == StallKind::kPeerGone && reported && kind.load(std::memory_order_relaxed) == uint8_t(StallKind::kLink)) {
      why = StallKind::kLink;
    }
    kind.store(static_cast<uint8_t>(why), std::memory_order_relaxed);
    peerLost.store(1, std::memory_order_relaxed);
  }
  // The comm's thread, when bytes move or a request completes: true, once, when that ends a reported stall (the
  // caller then says so in its log).
  bool over() {
    if (!reported) return false;
    reported = false;
    sinceMs.store(0, std::memory_order_relaxed);
    if (peerLost.load(std::memory_order_relaxed) == 0) kind.store(0, std::memory_order_relaxed);
    return true;
  }
};

struct RailHealth {
  char device[32] = {};  // the NIC's name (set once, before anyone reads)
  std::atomic<uint8_t> up{1};
  std::atomic<uint8_t> lastDown{0};  // RailEvent
  std::atomic<uint32_t> downs{0};        // times it went down
  std::atomic<uint32_t> recoveries{0};   // times it came back
  std::atomic<uint64_t> msgs{0}, bytes{0};  // what the connection sent on it
  // Rail failover (WEFT_RAIL_FAILOVER): times the connection moved its traffic off this rail, and messages it moved
  // off it (sends sent again on another rail, receives posted again there).
  std::atomic<uint32_t> failovers{0};
  std::atomic<uint64_t> moved{0};
  // Times the connection took the rail back after a failover (WEFT_RAIL_READMIT), and `msgs` when it last did.
  std::atomic<uint32_t> readmits{0};
  std::atomic<uint64_t> msgsAtReadmit{0};
  uint64_t msgsSinceReadmit() const {
    return readmits.load(std::memory_order_relaxed) == 0
               ? 0
               : msgs.load(std::memory_order_relaxed) - msgsAtReadmit.load(std::memory_order_relaxed);
  }

  void setDevice(const char* name) {
    std::strncpy(device, name != nullptr ? name : "", sizeof(device) - 1);
    device[sizeof(device) - 1] = '\0';
  }
  // The writer's updates (one thread: no read-modify-write needed).
  template <typename T, typename N>
  static void bump(std::atomic<T>& counter, N n) {
    counter.store(counter.load(std::memory_order_relaxed) + static_cast<T>(n), std::memory_order_relaxed);
  }
  void countSend(uint64_t n) {
    bump(msgs, 1);
    bump(bytes, n);
  }
  bool isUp() const { return up.load(std::memory_order_relaxed) != 0; }
  // True when this changed the state (the first report of a down rail, or of its return).
  bool markDown(RailEvent why) {
    if (!isUp()) return false;
    lastDown.store(static_cast<uint8_t>(why), std::memory_order_relaxed);
    bump(downs, 1);
    up.store(0, std::memory_order_relaxed);
    return true;
  }
  bool markUp() {
    if (isUp()) return false;
    bump(recoveries, 1);
    up.store(1, std::memory_order_relaxed);
    return true;
  }
  RailEvent lastDownEvent() const { return static_cast<RailEvent>(lastDown.load(std::memory_order_relaxed)); }
};

}  // namespace weft

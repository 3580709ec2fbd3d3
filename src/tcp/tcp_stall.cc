// SPDX-License-Identifier: Apache-2.0
// What a stalled TCP comm waits for, and why (the warning of TcpDataComm::watchStall; docs/hangs.md). The kernel's
// TCP_INFO tells the cases apart on a sender: a peer whose receive window is closed is alive (its host acknowledges
// everything) but reads nothing, so it has not posted its receive; unacknowledged segments being retransmitted mean
// the bytes stopped on the way (the link, or the peer's host). A receiver with a message half in is waiting on the
// link; one with nothing in is waiting on a peer that has not posted its send. A peer whose process died is not a
// stall: its sockets close and the comm fails at once. Also the device API's stall watch (TcpRmaComm::watchStalls),
// which asks the same of a pair's sockets (rmaStallCause), and its ledger for the dumps (TcpRmaComm::ledger).
//
// <linux/tcp.h> (for tcpi_snd_wnd, which glibc's <netinet/tcp.h> lacks) is included here only: the two headers
// cannot meet in one file.
#include <linux/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "tcp/tcp_comm.h"
#include "tcp/tcp_rma.h"
#include "weft/common/clock.h"
#include "weft/common/log.h"
#include "weft/common/sysfs.h"

namespace weft::tcp {
namespace {

struct TcpInfo {
  bool ok = false;
  unsigned state = 0;
  unsigned sndWnd = 0;  // the peer's advertised receive window (bytes)
  unsigned unacked = 0, retransmits = 0, backoff = 0, probes = 0, totalRetrans = 0;
  unsigned notsent = 0;  // bytes in the socket not sent yet
  unsigned lastAckMs = 0;  // since the peer's host last acknowledged anything (a keepalive's answer included)
};

TcpInfo tcpInfo(int fd) {
  TcpInfo out;
  tcp_info ti{};
  socklen_t len = sizeof(ti);
  if (fd < 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return out;
  out.ok = true;
  out.state = ti.tcpi_state;
  out.unacked = ti.tcpi_unacked;
  out.retransmits = ti.tcpi_retransmits;
  out.backoff = ti.tcpi_backoff;
  out.probes = ti.tcpi_probes;
  out.totalRetrans = ti.tcpi_total_retrans;
  out.lastAckMs = ti.tcpi_last_ack_recv;
  // fields the kernel may not fill (older kernels write a shorter struct)
  constexpr size_t kWndEnd = offsetof(tcp_info, tcpi_snd_wnd) + sizeof(ti.tcpi_snd_wnd);
  out.sndWnd = len >= kWndEnd ? ti.tcpi_snd_wnd : ~0u;
  constexpr size_t kNotsentEnd = offsetof(tcp_info, tcpi_notsent_bytes) + sizeof(ti.tcpi_notsent_bytes);
  out.notsent = len >= kNotsentEnd ? ti.tcpi_notsent_bytes : 0;
  return out;
}

std::string secs(int64_t ms) { return fmt::format("{} s", ms / 1000); }

constexpr const char* kBehind =
    "that rank is behind (in compute, or waiting on another rank: its own stall lines say on whom)";

}  // namespace

std::string TcpSendComm::stallCause(int64_t nowMs, StallKind* kind) {
  *kind = StallKind::kOther;
  // The oldest message not all in the kernel yet: on a flow's queue, with pieces to hand out, or its header held.
  TcpRequest* oldest = nullptr;
  auto consider = [&](TcpRequest* r) {
    if (r != nullptr && (oldest == nullptr || static_cast<int32_t>(r->seq - oldest->seq) < 0)) oldest = r;
  };
  int busy = -1;  // a flow with bytes queued
  for (int k = 0; k < nFlows_; ++k) {
    if (flows_[k].head == nullptr) continue;
    consider(flows_[k].head->r);
    if (busy < 0 || flows_[k].queued > flows_[busy].queued) busy = k;
  }
  consider(bulkHead_);
  consider(heldHead_);
  std::string what = "nothing queued";
  if (oldest != nullptr) {
    MsgHeader h;
    std::memcpy(&h, oldest->head.hdr, sizeof(h));
    what = fmt::format("message {} (tag {}, {} bytes, posted {} ago) is not all sent", oldest->seq, h.tag,
                       oldest->size, secs(nowMs - oldest->postedMs));
  }
  // Flows that have not joined yet wait for the peer's process too (its calls answer them).
  if (joiningLeft_ > 0) what += fmt::format(" ({} of its flows are still joining)", joiningLeft_);
  if (busy < 0) return what;
  const TcpInfo ti = tcpInfo(flows_[busy].fd);
  if (!ti.ok) return what;
  const std::string flow = flowName(busy);
  if (ti.sndWnd == 0) {
    *kind = StallKind::kBehind;
    return what + fmt::format("; the peer's receive window is closed{}: its process is alive (its host "
                              "acknowledges every byte) but reads nothing, so it has not posted the receive: {}",
                              flow, kBehind);
  }
  if (ti.unacked > 0 && (ti.retransmits > 0 || ti.backoff > 0 || ti.probes > 0)) {
    *kind = StallKind::kLink;
    return what + fmt::format("; the bytes stopped on the way{}: {} segments unacknowledged, retransmitted {} "
                              "times (backoff {}): the link, or the peer's host (it fails after WEFT_PEER_TIMEOUT "
                              "if nothing is acknowledged)",
                              flow, ti.unacked, ti.retransmits, ti.backoff);
  }
  if (ti.unacked == 0 && ti.notsent > 0) {
    // Nothing in flight although the peer's window is open: the kernel cannot send at all.
    const std::string ifname = flows_[busy].iface < dev_.rails.size() ? dev_.rails[flows_[busy].iface].ifname : "";
    const bool down = !ifname.empty() && !sysfs::linkUp(sysfs::linkSourceFor(ifname, nullptr));
    *kind = StallKind::kLink;
    return what + fmt::format("; nothing is in flight{} although the peer's window is open ({} bytes wait in the "
                              "socket): {} (the comm fails after WEFT_PEER_TIMEOUT)",
                              flow, ti.notsent,
                              down ? "the bytes stopped on the way: this host's link " + ifname + " is down"
                                   : "the bytes stopped on the way: this host's route to the peer is gone");
  }
  return what + fmt::format("; the socket{} is full ({} bytes unsent, peer window {} bytes, {} unacknowledged)",
                            flow, ti.notsent, ti.sndWnd, ti.unacked);
}

std::string TcpRecvComm::stallCause(int64_t nowMs, StallKind* kind) {
  *kind = StallKind::kOther;
  TcpRequest* r = head_;  // the oldest posted receive not complete
  int waiting = 0;
  for (TcpRequest* q = head_; q != nullptr; q = q->next) ++waiting;
  // A message half in: the one flow 0 is reading, or one in pieces whose bytes are not all in.
  uint64_t got = 0, size = 0;
  bool mid = false;
  if (cur_ != nullptr || curU_ != nullptr) {
    mid = true;
    if (cur_ != nullptr) got = cur_->got[curBuf_], size = cur_->want[curBuf_];
    if (curU_ != nullptr) got = curU_->got, size = curU_->size;
  }
  for (int i = 0; slots_ && i < kWindow && !mid; ++i) {
    if (!slots_[i].open) continue;
    mid = true;
    size = slots_[i].size;
    got = slots_[i].size - slots_[i].left;
  }
  if (mid) {
    *kind = StallKind::kLink;
    return fmt::format("a message stopped half way: {} of its {} bytes arrived, then nothing on its {} flow{}; the "
                       "bytes stopped on the way: the link, or the peer's host (a peer process that ended would "
                       "have closed its sockets; a silent host fails the comm after WEFT_PEER_TIMEOUT)",
                       got, size, ready_, ready_ > 1 ? "s" : "");
  }
  std::string what = fmt::format("{} receive{} wait", waiting, waiting == 1 ? "" : "s");
  if (r != nullptr) {
    what += fmt::format(" (the oldest: tag {}{}, up to {} bytes, posted {} ago)", r->tags[0], r->n > 1 ? " and more" : "",
                        r->cap[0], secs(nowMs - r->postedMs));
  }
  const TcpInfo ti = tcpInfo(flows_[0].fd);
  std::string aside;
  int held = 0;
  for (Unexpected* u = unexpHead_; u != nullptr; u = u->next) ++held;
  if (held > 0) aside = fmt::format("; {} message{} for other tags came and are held aside", held, held == 1 ? "" : "s");
  if (!ti.ok || ti.state != 1 /* TCP_ESTABLISHED (<netinet/tcp.h>, which cannot be included here) */) {
    return what + " and the peer has sent nothing for them" + aside;
  }
  // Keepalives go out after a second of silence, one a second (SocketOptions): a live host answers each.
  if (ti.probes > 0 && ti.lastAckMs > 2500) {
    *kind = StallKind::kLink;
    return what + fmt::format(" and the peer has sent nothing for them{}; its host has answered nothing for {} "
                              "(keepalive probes unanswered: {}): the link, or the peer's host, is down (the comm "
                              "fails after WEFT_PEER_TIMEOUT)",
                              aside, secs(ti.lastAckMs), ti.probes);
  }
  *kind = StallKind::kBehind;
  return what + fmt::format(" and the peer has sent nothing for them{}; its connection is up (its host answered {} "
                            "ms ago), so its process is alive but has not posted the matching send: {}",
                            aside, ti.lastAckMs, kBehind);
}

// The device API's TCP transport: a put needs nothing of the target's application, but its proxy must read the
// socket (NCCL calls progress there), and a get needs it to answer.
std::string rmaStallCause(int fd, bool sending, bool midPayload, StallKind* kind) {
  *kind = StallKind::kOther;
  const TcpInfo ti = tcpInfo(fd);
  if (!ti.ok) return "its socket says nothing (TCP_INFO failed)";
  constexpr const char* kProxy =
      "that rank's proxy is not progressing the device API (the rank is behind: in compute, its proxy thread "
      "blocked, or waiting on another rank)";
  if (sending) {
    if (ti.sndWnd == 0) {
      *kind = StallKind::kBehind;
      return fmt::format("its receive window is closed: its process is alive (its host acknowledges every byte) but "
                         "reads nothing: {}",
                         kProxy);
    }
    if (ti.unacked > 0 && (ti.retransmits > 0 || ti.backoff > 0 || ti.probes > 0)) {
      *kind = StallKind::kLink;
      return fmt::format("the bytes stopped on the way: {} segments unacknowledged, retransmitted {} times (backoff "
                         "{}): the link, or its host",
                         ti.unacked, ti.retransmits, ti.backoff);
    }
    if (ti.unacked == 0 && ti.notsent > 0) {
      *kind = StallKind::kLink;
      return fmt::format("nothing is in flight although its window is open ({} bytes wait in the socket): the bytes "
                         "stopped on the way, this host's link or route to it is gone",
                         ti.notsent);
    }
    return fmt::format("the socket is full ({} bytes unsent, its window {} bytes, {} unacknowledged)", ti.notsent,
                       ti.sndWnd, ti.unacked);
  }
  if (ti.probes > 0 && ti.lastAckMs > 2500) {
    *kind = StallKind::kLink;
    return fmt::format("its host has answered nothing for {} (keepalive probes unanswered: {}): the link, or its host, "
                       "is down",
                       secs(ti.lastAckMs), ti.probes);
  }
  if (midPayload) {
    *kind = StallKind::kLink;
    return "the put stopped half way with the connection up: the bytes stopped on the way, or its proxy stopped "
           "writing mid-put";
  }
  *kind = StallKind::kBehind;
  return fmt::format("its connection is up (its host answered {} ms ago), so its process is alive but has not "
                     "answered: {}",
                     ti.lastAckMs, kProxy);
}

// The device API's stall watch (tcp_rma.h).
void TcpRmaComm::watchStalls() {
  if (stallMs_ <= 0) return;
  const int64_t now = coarseNowMs();
  if (now - stallCheckMs_ < 100) return;
  stallCheckMs_ = now;
  std::vector<int> gets(peers_.size(), 0);
  pool_.forEach([&](RmaOp& op) {
    if (op.state == RmaOp::kWaiting && op.peer < gets.size()) ++gets[op.peer];
  });
  for (uint32_t r = 0; r < peers_.size(); ++r) {
    PeerSocket& p = peers_[r];
    bool pieces = p.waitingPieces || p.pieceHead != nullptr;
    for (const auto& f : p.data) pieces |= f.op != nullptr || f.inPiece;
    const bool waiting = !p.lost && p.fd >= 0 && (p.head != nullptr || gets[r] > 0 || p.inPayload || pieces);
    if (!waiting || p.moved != p.watchedMoved) {
      if (p.stallReported && !p.lost) p.stallKind = StallKind::kNone;
      if (p.stallReported) {
        WEFT_INFO(NCCL_NET, "RMA (rank {} of {}): {} moves again after a stall of {} s", rank_, nranks_, p.name,
                  (now - p.quietSinceMs) / 1000);
      }
      p.watchedMoved = p.moved;
      p.quietSinceMs = now;
      p.stallReported = false;
      continue;
    }
    if (p.stallReported || now - p.quietSinceMs < stallMs_) continue;
    p.stallReported = true;
    std::string what;
    int queued = 0;
    for (RmaOp* op = p.head; op != nullptr; op = op->next) queued += op->internal ? 0 : 1;
    if (p.head != nullptr) {
      const RmaOp* h = p.head;
      what = fmt::format("{} operation{} of ours wait to leave for it (the first: {} bytes, {} sent)", queued,
                         queued == 1 ? "" : "s", h->frame.type == RmaFrame::kPut ? h->frame.size : 0,
                         h->payloadSent);
    }
    if (gets[r] > 0) {
      what += fmt::format("{}{} get{} wait{} for its answer", what.empty() ? "" : "; ", gets[r], gets[r] == 1 ? "" : "s",
                          gets[r] == 1 ? "s" : "");
    }
    if (p.inPayload) {
      what += fmt::format("{}a put from it is half in ({} bytes to come)", what.empty() ? "" : "; ", p.payloadLeft);
    }
    if (p.waitingPieces) {
      const auto it = p.tallies.find(p.cur.putId);
      what += fmt::format("{}a put from it waits for its pieces ({} of {} bytes in)", what.empty() ? "" : "; ",
                          it == p.tallies.end() ? 0 : it->second.bytes, p.cur.size);
    }
    // Pieces of ours waiting to leave on the data flows: the socket of the first that holds one tells.
    int pieceFd = -1;
    uint64_t pieceBytes = 0;
    for (const RmaOp* op = p.pieceHead; op != nullptr; op = op->nextPiece) pieceBytes += op->frame.size - op->assigned;
    for (const auto& f : p.data) {
      if (f.op == nullptr) continue;
      pieceBytes += f.len - f.sent;
      if (pieceFd < 0) pieceFd = f.fd;
    }
    if (pieceBytes > 0) {
      what += fmt::format("{}{} bytes of our puts' pieces wait to leave on its {} data flows", what.empty() ? "" : "; ",
                          pieceBytes, p.data.size());
    }
    StallKind kind = StallKind::kOther;
    const bool sending = p.head != nullptr || pieceFd >= 0;
    const std::string cause =
        rmaStallCause(p.head == nullptr && pieceFd >= 0 ? pieceFd : p.fd, sending, p.inPayload || p.waitingPieces, &kind);
    ++p.stalls;
    p.stallKind = kind;
    stallEvents_.fetch_add(1, std::memory_order_relaxed);
    WEFT_WARN("RMA (rank {} of {}): stalled on {}: nothing moved either way for {} s (WEFT_STALL_S): {}; {} [{}]",
              rank_, nranks_, p.name, (now - p.quietSinceMs) / 1000, what, cause, stallKindName(kind));
  }
}

// The device API's ledger (tcp_rma.h, docs/hangs.md).
bool TcpRmaComm::ledger(std::vector<PeerLedger>* out) {
  // From the dump's thread: the data path holds the lock only for a call; set-up may hold it for a pass.
  std::unique_lock<std::mutex> lock;
  if (!lockForLedger(&lock)) return false;
  std::vector<std::vector<const RmaOp*>> byPeer(peers_.size());
  pool_.forEach([&](RmaOp& op) {
    if (!op.internal && (op.state == RmaOp::kQueued || op.state == RmaOp::kWaiting) && op.peer < byPeer.size()) {
      byPeer[op.peer].push_back(&op);
    }
  });
  for (uint32_t r = 0; r < peers_.size(); ++r) {
    const PeerSocket& p = peers_[r];
    // Every peer with its socket (the report pairs the two ends of a pair by their addresses, an idle end too), and
    // those lost in trouble; not itself, nor a peer that closed in order.
    if (static_cast<int>(r) == rank_ || (p.fd < 0 && p.stallKind == StallKind::kNone)) continue;
    PeerLedger l;
    l.rank = static_cast<int>(r);
    l.name = p.name;
    l.peer = p.peerAddr;
    l.local = p.localAddr;
    l.moved = p.moved;
    l.stalls = p.stalls;
    l.stalledSinceMs = p.stallReported && !p.lost ? std::max<int64_t>(p.quietSinceMs, 1) : 0;
    l.kind = p.stallKind;
    l.inflight = static_cast<uint32_t>(byPeer[r].size());
    auto& ops = byPeer[r];
    std::sort(ops.begin(), ops.end(), [](const RmaOp* a, const RmaOp* b) { return a->postMs < b->postMs; });
    for (size_t i = 0; i < ops.size() && i < PeerLedger::kMaxOps; ++i) {
      const RmaOp* op = ops[i];
      LedgerOp o;
      const bool put = op->frame.type == RmaFrame::kPut;
      o.kind = put ? (op->frame.size > 0 ? "put" : "signal") : op->frame.type == RmaFrame::kGetRequest ? "get" : "flush";
      o.bytes = op->frame.size;
      o.done = put ? op->payloadSent : 0;
      o.postMs = op->postMs;
      l.ops.push_back(o);
    }
    out->push_back(std::move(l));
  }
  return true;
}

}  // namespace weft::tcp

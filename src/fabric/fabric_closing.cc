// SPDX-License-Identifier: Apache-2.0
// Closing a data comm: cancels, parking until the provider is done, close notices, and the send comms that
// linger after NCCL closed them until their peer acknowledges (ClosingComms).
#include "fabric/fabric_comm.h"

#include "weft/common/clock.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <time.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>
#include <thread>

#include "weft/common/params.h"
#include "weft/nccl/net.h"
#include "weft/transport/agreement.h"

namespace weft::fabric {

// A parked receive comm first sends the acknowledgements it still owes (the sender's sends wait for them).
bool FabricDataComm::drained(DataSink* s) {
  auto* c = static_cast<FabricDataComm*>(s);
  if (!c->ackQ_.empty()) c->flushAcks();
  const bool done = c->opsInFlight() == 0 && c->ackQ_.empty() && !c->awaitingWrites();
  if (done) c->noteWritesOver();  // its writes are over: the receiver need not wait for more
  return done;
}

void FabricDataComm::noteWritesOver() {
  if (recvSide_ || !proto_.rdma || !writesAwaited_) return;  // a failed comm too: it writes nothing more either
  for (int k = 0; k < nRails_; ++k) {
    if (rails_[k].ep != nullptr) (void)injectNote(k, wire::kWritesOver, peerId_);  // lost: the receiver waits it out
  }
}

void FabricDataComm::onWritesOver(Endpoint* ep) noexcept {
  for (int k = 0; k < nRails_; ++k) {
    if (rails_[k].ep == ep) writesOverRails_ |= 1u << k;
  }
}

int FabricDataComm::awaitedWrites() const {
  if (!recvSide_ || bySeq_ == nullptr) return 0;
  int n = 0;
  for (int i = 0; i < allocated(); ++i) {
    const FabricRecvRequest& r = recvReq(i);
    if (r.magic_ != kRequestMagic || !r.offerPosted) continue;
    for (int b = 0; b < r.n; ++b) {
      n += (r.flags[b] & (FabricRecvRequest::kOffered | FabricRecvRequest::kDone)) == FabricRecvRequest::kOffered;
    }
  }
  return n;
}

bool FabricDataComm::awaitingWrites() const {
  return awaitUntilMs_ != 0 && !peerWritesOver() && fatal_ == Status::kOk && coarseNowMs() < awaitUntilMs_ &&
         awaitedWrites() > 0;
}

// libfabric's rxm (over verbs; 2.x's over tcp too) closes a connection's endpoint before it reads what that
// connection left in the queue the connections share: a message the peer's write left there (the rdma
// protocol's completion data takes one of rxm's receive buffers) is then handed back to the freed endpoint
// (rxm_close_conn -> rxm_flush_msg_cq -> rxm_handle_comp -> rxm_post_recv; crashed the receiver of
// teardown.inflight over 2.1's verbs;ofi_rxm, 1 run in 15 in the soft-RoCE guest). A large write shows nothing
// until its last byte lands, so no quiet spell before the close (~Endpoint, EndpointGroup::drain) rules it out.
// A receive comm closed with buffers offered to the peer and not yet written (an abort: NCCL closes with receives
// outstanding, and the peer may be writing them) therefore keeps its endpoints open until they land, the peer
// says it writes no more (wire::kWritesOver, noteWritesOver), the comm fails, or kAwaitWritesMs (WEFT_PEER_TIMEOUT
// if shorter) passes: a dead peer costs that once per close.
void FabricDataComm::holdForWrites() {
  if (!recvSide_ || fatal_ != Status::kOk || peerWritesOver()) return;
  if (!Endpoint::closeRacesArrivals(dev_.props().provider) || awaitedWrites() == 0) return;
  awaitUntilMs_ = coarseNowMs() + std::min<int64_t>(Endpoint::kAwaitWritesMs, peerTimeoutMs_);
}

void FabricDataComm::closeComm(bool sendSide) {
  writesAwaited_ = sendSide && proto_.rdma && (outstanding_ > 0 || offersHeld());
  ClosingComms::poll();
  refreshRailHealth();  // what its last log line says
  if (!ackQ_.empty()) flushAcks();  // owed to the sender (a private endpoint: best effort, it closes now)
  if (proto_.acks) {
    WEFT_INFO(NCCL_NET, "comm with {}: delivery acknowledgements {} {} messages in {} acknowledgements{}",
              peerName_, recvSide_ ? "sent for" : "received for", acksTaken_, acksSent_,
              strayAcks_ != 0 ? fmt::format(" ({} naming no send in flight)", strayAcks_) : std::string());
  }
  if (!group_->shared()) {
    // Its own endpoints close with it, canceling whatever is in flight (an abort: NCCL closed it with requests
    // outstanding). A send comm whose sends are all done first makes sure they reached the peer where the
    // provider runs over TCP: it may still hold their last bytes (tcp: in its own buffer, thrown away with the
    // endpoint; or the socket's, lost to the reset that closing with the peer's offers unread sends), and the
    // peer's receive would then wait for them forever (seen: 17 runs in 200 of data.recv_larger on a loaded
    // machine, two rails between namespaces).
    bool sent = false;
    for (const Rail& r : rails_) sent = sent || r.health->msgs.load(std::memory_order_relaxed) > 0;
    if (sendSide && sent && fatal_ == Status::kOk && opsInFlight() == 0 && dev_.streamSockets()) {
      closing_ = true;
      lingering_ = true;
      for (Rail& r : rails_) r.note = kNoteWant;
      notesWaiting_ = nRails_;
      postNotes();
      ClosingComms::add(this, coarseNowMs() + peerTimeoutMs_);
      return;
    }
    holdForWrites();  // its endpoints close with it: it waits here (NCCL's service thread, bounded)
    const int64_t since = coarseNowMs();
    while (awaitingWrites() && readRails() == Status::kOk) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (awaitUntilMs_ != 0) {
      WEFT_INFO(NCCL_NET, "comm with {}: endpoints close after {} ms waiting for the writes it offered ({} not landed)",
                peerName_, coarseNowMs() - since, awaitedWrites());
    }
    if (opsInFlight() == 0) noteWritesOver();
    delete this;
    return;
  }
  std::shared_ptr<EndpointGroup> keep = group_;  // the group (and its lock) outlive this comm
  {
    std::lock_guard<std::mutex> lock(keep->mutex());
    closing_ = true;
    holdForWrites();
    // Receives nothing will fill any more: canceled (each comes back as a canceled completion).
    for (int i = 0; recvSide_ && i < allocated(); ++i) {
      FabricRecvRequest& r = recvReq(i);
      if (r.magic_ != kRequestMagic) continue;
      for (int b = 0; b < r.n; ++b) {
        if ((r.flags[b] & FabricRecvRequest::kPosted) == 0 || (r.flags[b] & FabricRecvRequest::kCanceled) != 0) {
          continue;
        }
        if (fi_cancel(&rails_[r.rail[b]].ep->ep()->fid, &r.ctx[b].fi) == 0) r.flags[b] |= FabricRecvRequest::kCanceled;
      }
    }
    if (opsInFlight() == 0 && ackQ_.empty() && !awaitingWrites()) {
      noteWritesOver();
      delete this;  // leaves the table under the lock
    } else {
      WEFT_INFO(NCCL_NET, "comm with {} closed with {} operations in flight{}: parked until they complete", peerName_,
                opsInFlight(), awaitUntilMs_ != 0 ? fmt::format(" and {} writes offered", awaitedWrites()) : "");
      logRails();
      rails_[0].ep->closeListen(localId_.get());
      parkedIn_ = keep.get();
      group_.reset();
      keep->park(this, &FabricDataComm::drained, awaitUntilMs_);
    }
  }
}  // the last comm of the group gone: the group closes here, outside its lock

// Close notices (a lingering send comm) and acks (a receive comm): posted where wanted; a push-back leaves the
// rail wanting, for the next progress call.
void FabricDataComm::postNotes() {
  for (Rail& r : rails_) {
    if ((r.note & kNoteWant) == 0 || (r.note & kNoteInFlight) != 0) continue;
    bool again = false;
    Status st = r.ep->sendCloseNote(r.peer, peerId_, !lingering_, r.noteCtx, &again);
    if (again) continue;
    r.note = static_cast<uint8_t>((r.note & ~kNoteWant) | (st == Status::kOk ? kNoteInFlight : kNoteFailed));
    --notesWaiting_;
  }
}

void FabricDataComm::onCloseNote(Endpoint* ep, bool ack) noexcept {
  for (Rail& r : rails_) {
    if (r.ep != ep) continue;
    if (ack) {
      if (lingering_) r.note |= kNoteAcked;
      return;
    }
    if (lingering_ || (r.note & kNoteWant) != 0) return;  // a notice to a send comm: not ours to answer
    if (recvSide_) onWritesOver(ep);  // a lingering sender's notice: its sends (and so writes) are all done
    r.note |= kNoteWant;
    ++notesWaiting_;
    postNotes();  // an ack in flight already: this one goes when it has completed
    return;
  }
}

// A notice is sent once per rail. A peer that closed its side before reading it never acks: the comm then waits
// for WEFT_PEER_TIMEOUT (or finalize). Sending it again to find out costs more: over rxm each send to a closed
// peer sets up a new connection attempt, and repeating every 100 ms grew a process by 140 MiB over the
// hygiene.connect_cycles check that followed.
bool FabricDataComm::lingerStep() {
  if (notesWaiting_ > 0) postNotes();
  for (Rail& rail : rails_) {
    if (rail.ep->progress() != Status::kOk) return true;  // the queue itself failed: nothing more will come
  }
  if (fatal_ != Status::kOk) return true;
  for (const Rail& r : rails_) {
    if ((r.note & (kNoteAcked | kNoteFailed)) == 0) return false;
  }
  return true;
}

namespace {

struct Closing {
  FabricDataComm* comm;
  int64_t deadlineMs;
};

struct ClosingState {
  std::mutex mu;
  std::vector<Closing> list;
  std::atomic<int64_t> lastMs{0};  // the last look (coarse milliseconds)
};

ClosingState& closingState() {
  static ClosingState* s = new ClosingState;  // never destroyed: nothing of libfabric is touched at exit
  return *s;
}

}  // namespace

std::atomic<size_t> ClosingComms::count_{0};

void ClosingComms::add(FabricDataComm* comm, int64_t deadlineMs) {
  ClosingState& s = closingState();
  std::lock_guard<std::mutex> lock(s.mu);
  s.list.push_back(Closing{comm, deadlineMs});
  count_.store(s.list.size(), std::memory_order_relaxed);
}

void ClosingComms::pollSlow(bool wait, bool rateLimited) {
  ClosingState& s = closingState();
  const int64_t now = coarseNowMs();
  if (rateLimited && now == s.lastMs.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(s.mu, std::defer_lock);
  if (wait) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;  // another thread is at it
  }
  s.lastMs.store(now, std::memory_order_relaxed);
  for (size_t i = 0; i < s.list.size();) {
    Closing& c = s.list[i];
    const bool done = c.comm->lingerStep();
    if (!done && now < c.deadlineMs) {
      ++i;
      continue;
    }
    if (!done) {
      WEFT_INFO(NCCL_NET, "a closed send comm's close notice was not acknowledged within WEFT_PEER_TIMEOUT (the "
                "peer closed its side, or runs an older weft): its endpoints close now");
    }
    delete c.comm;
    c = s.list.back();
    s.list.pop_back();
  }
  count_.store(s.list.size(), std::memory_order_relaxed);
}

void ClosingComms::drain(int64_t budgetMs) {
  const int64_t end = coarseNowMs() + budgetMs;
  while (size() != 0 && coarseNowMs() < end) pollSlow(true, false);
  ClosingState& s = closingState();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.list.empty()) {
    WEFT_INFO(NCCL_NET, "finalize: {} closed send comms still wait for their peers' close acks after {} ms; their "
              "endpoints close now", s.list.size(), budgetMs);
  }
  for (Closing& c : s.list) delete c.comm;
  s.list.clear();
  count_.store(0, std::memory_order_relaxed);
}

}  // namespace weft::fabric

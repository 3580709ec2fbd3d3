// SPDX-License-Identifier: Apache-2.0
// The endpoint's connection manager: listens and their inboxes, connect requests and replies, the connect slots.
// Both sides speak wire.h's request/reply; the endpoint itself (fabric_endpoint.cc) posts and progresses them.
#include "fabric/fabric_endpoint.h"

#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "weft/common/clock.h"
#include "weft/transport/agreement.h"

#include <algorithm>
#include <cstring>

namespace weft::fabric {


void Endpoint::refuse(const ConnectRequest& r, uint16_t status) {
  WEFT_WARN("on {}: connection from {} {}", dev_.props().name, addrString(wire::requestAddr(r), r.addrLen),
            replyStatusName(status));
  // Tell the peer so it fails fast instead of timing out, but never let a flood of bogus requests grow the
  // address vector without bound.
  if (++refusals_ > 16) return;
  fi_addr_t to;
  // A connector of version 4 or later waits for its answer under its comm id, an older one under id 0; an older
  // one reads a shorter reply (wire::replyBytesFor).
  const uint32_t id = wire::requestComm(r);
  const uint32_t toComm = id <= wire::kMaxCommId ? id : 0;
  if (insert(wire::requestAddr(r), r.addrLen, &to) == Status::kOk) {
    sendReply(to, toComm, status, r.token, 0, nullptr, 0, nullptr, r.version);
  }
}


Status Endpoint::postRequestRecv(int slot) {
  requestRecvCtx_[slot].index = static_cast<uint16_t>(slot);
  return postControlRecv(&ctl_->requestIn[slot], sizeof(ConnectRequest), wire::ctrlTag(wire::CtrlKind::kConnRequest),
                         requestRecvCtx_[slot], OpKind::kConnRequest, "connection-request");
}

Status Endpoint::openListen(uint32_t listenId) {
  if (!listens_.emplace(listenId, Inbox{}).second) {
    WEFT_WARN("on {}: listen id {} is already open on this endpoint", dev_.props().name, listenId);
    return Status::kInternal;
  }
  if (!requestsPosted_) {
    for (int i = 0; i < kRequestSlots; ++i) {
      if (Status st = postRequestRecv(i); st != Status::kOk) return st;
    }
    requestsPosted_ = true;
  }
  return Status::kOk;
}

void Endpoint::closeListen(uint32_t listenId) {
  auto it = listens_.find(listenId);
  if (it == listens_.end()) return;
  Inbox box = std::move(it->second);
  listens_.erase(it);
  for (const ConnectRequest& r : box.queue) refuse(r, box.accepted ? kAlreadyConnected : kNoSuchListen);
}

void Endpoint::markAccepted(uint32_t listenId) {
  auto it = listens_.find(listenId);
  if (it == listens_.end()) return;
  it->second.accepted = true;
  std::deque<ConnectRequest> rest;
  rest.swap(it->second.queue);
  for (const ConnectRequest& r : rest) refuse(r, kAlreadyConnected);
}

// A request arrived in `slot`: malformed ones are ignored, the rest refused or queued for their listen.
void Endpoint::onRequest(int slot) {
  const ConnectRequest& r = ctl_->requestIn[slot];
  if (r.magic != ConnectRequest::kMagic || r.addrLen == 0 || r.addrLen > sizeof(r.addr) ||
      (r.version >= ConnectRequest::kLayoutSince && !r.rails.valid())) {
    WEFT_WARN("on {}: ignored a malformed connection request", dev_.props().name);
    return;
  }
  if (r.version != ConnectRequest::kVersion) {
    WEFT_WARN("on {}: connection from {} speaks weft connection protocol v{}, this end v{}: run the same weft build "
              "on every node",
              dev_.props().name, addrString(wire::requestAddr(r), r.addrLen), r.version, ConnectRequest::kVersion);
    refuse(r, kBadVersion);
    return;
  }
  auto it = listens_.find(r.listenId);
  if (it == listens_.end()) {
    refuse(r, kNoSuchListen);
    return;
  }
  if (it->second.accepted) {
    refuse(r, kAlreadyConnected);
    return;
  }
  if (it->second.queue.size() >= kInboxMax) {
    WEFT_WARN("on {}: more than {} connection requests wait for listen {}: one from {} dropped", dev_.props().name,
              kInboxMax, r.listenId, addrString(r.addr, r.addrLen));
    return;
  }
  it->second.queue.push_back(r);
}

bool Endpoint::takeConnRequest(uint32_t listenId, ConnectRequest* out) {
  auto it = listens_.find(listenId);
  if (it == listens_.end() || it->second.queue.empty()) return false;
  *out = it->second.queue.front();
  it->second.queue.pop_front();
  return true;
}

bool Endpoint::replySlotFree() const {
  for (auto st : replySlot_) {
    if (st == SlotState::kFree) return true;
  }
  return false;
}

bool Endpoint::replyDone(const ReplyTicket& t) const {
  return t.slot < 0 || replyGen_[static_cast<size_t>(t.slot)] != t.gen;
}

Status Endpoint::sendReply(fi_addr_t to, uint32_t toComm, uint16_t status, uint64_t token, uint32_t flags,
                           const RailAddrs* rails, uint32_t commId, ReplyTicket* ticket, uint16_t peerVersion) {
  if (ticket != nullptr) *ticket = ReplyTicket{};
  int slot = -1;
  for (int i = 0; i < kReplySlots; ++i) {
    if (replySlot_[i] == SlotState::kFree) {
      slot = i;
      break;
    }
  }
  if (slot < 0) return Status::kOk;  // refusals are best effort; the connector times out instead
  ctl_->replyOut[slot] = ConnectReply{ConnectReply::kMagic, ConnectRequest::kVersion, status, token, flags, commId,
                                      rails != nullptr ? *rails : RailAddrs{}, transport::localDigest()};
  replyLen_[slot] = wire::replyBytesFor(peerVersion);
  replyTo_[slot] = to;
  replyComm_[slot] = toComm;
  replySendCtx_[slot].kind = OpKind::kCtrlSend;
  replySendCtx_[slot].index = static_cast<uint16_t>(slot);
  replySlot_[slot] = SlotState::kQueued;
  if (ticket != nullptr) *ticket = ReplyTicket{slot, replyGen_[static_cast<size_t>(slot)]};
  controlQueued_ = true;
  flushControl();
  return Status::kOk;
}


Status Endpoint::startConnect(uint32_t commId, fi_addr_t to, uint64_t token, uint32_t listenId, uint32_t flags,
                              uint32_t eagerMax, const RailAddrs& rails, int* slot) {
  *slot = -1;
  int i = 0;
  while (i < kConnectSlots && connects_[i].commId != 0) ++i;
  if (i == kConnectSlots) return Status::kOk;  // every slot busy: the caller tries again
  if (!replyAnyPosted_) {
    replyAnyCtx_.index = kConnectSlots;
    if (Status st = postControlRecv(&ctl_->replyAny, sizeof(ConnectReply), wire::ctrlTag(wire::CtrlKind::kConnReply),
                                    replyAnyCtx_, OpKind::kConnReply, "connection-reply");
        st != Status::kOk) {
      return st;
    }
    replyAnyPosted_ = true;
  }
  ConnectSlot& c = connects_[i];
  c = ConnectSlot{};
  c.commId = commId;
  c.to = to;
  c.token = token;
  c.sendCtx.kind = OpKind::kCtrlSend;
  c.sendCtx.owner = &connects_;
  c.sendCtx.index = static_cast<uint16_t>(i);
  c.recvCtx.index = static_cast<uint16_t>(i);
  if (Status st = repostReplyRecv(i); st != Status::kOk) {
    c.commId = 0;
    return st;
  }
  ConnectRequest& r = ctl_->requestOut[i];
  r.magic = ConnectRequest::kMagic;
  r.version = ConnectRequest::kVersion;
  r.addrLen = static_cast<uint16_t>(name_.size());
  r.token = token;
  r.reserved = 0;
  r.tunerDigest = transport::localDigest();
  r.flags = flags;
  r.eagerMax = eagerMax;
  r.listenId = listenId;
  r.commId = commId;
  r.rails = rails;
  std::memcpy(r.addr, name_.data(), name_.size());
  c.request = SlotState::kQueued;
  controlQueued_ = true;
  *slot = i;
  flushControl();
  return c.error;
}

Status Endpoint::repostReplyRecv(int slot) {
  ConnectSlot& c = connects_[slot];
  c.replyPending = false;
  Status st = postControlRecv(&ctl_->replyIn[slot], sizeof(ConnectReply),
                              wire::ctrlTag(wire::CtrlKind::kConnReply, c.commId), c.recvCtx, OpKind::kConnReply,
                              "connection-reply");
  c.replyPosted = st == Status::kOk;
  return st;
}

// slot kConnectSlots: the id-0 receive (a version-3 listener's answer), handed to the connect whose token it echoes.
void Endpoint::onReply(int slot, bool ok, Status st) {
  if (slot == kConnectSlots) {
    replyAnyPosted_ = false;
    if (!ok) return;  // canceled with the endpoint, or the endpoint is failing: nothing to answer
    for (int i = 0; i < kConnectSlots; ++i) {
      ConnectSlot& c = connects_[i];
      if (c.commId != 0 && !c.ended && !c.replyPending && c.token == ctl_->replyAny.token) {
        ctl_->replyIn[i] = ctl_->replyAny;
        c.replyPending = true;
        break;
      }
    }
    replyAnyCtx_.index = kConnectSlots;
    replyAnyPosted_ = postControlRecv(&ctl_->replyAny, sizeof(ConnectReply), wire::ctrlTag(wire::CtrlKind::kConnReply),
                                      replyAnyCtx_, OpKind::kConnReply, "connection-reply") == Status::kOk;
    return;
  }
  ConnectSlot& c = connects_[slot];
  c.replyPosted = false;
  if (c.cancelling || c.ended) {
    c.cancelling = false;
    tryFreeConnect(slot);
    return;
  }
  if (!ok) {
    if (c.error == Status::kOk) c.error = st;
    return;
  }
  c.replyPending = true;
}

bool Endpoint::takeReply(int slot, ConnectReply* out) {
  ConnectSlot& c = connects_[slot];
  if (!c.replyPending) return false;
  *out = ctl_->replyIn[slot];
  c.replyPending = false;
  return true;
}

void Endpoint::endConnect(int slot) {
  if (slot < 0 || slot >= kConnectSlots) return;
  ConnectSlot& c = connects_[slot];
  c.ended = true;
  c.replyPending = false;
  if (c.request == SlotState::kQueued) c.request = SlotState::kFree;  // never handed over: nothing to wait for
  if (c.replyPosted && !c.cancelling) {
    int rc = fi_cancel(&ep_->fid, &c.recvCtx.fi);
    if (rc == 0) {
      c.cancelling = true;
    } else {
      WEFT_WARN("on {}: canceling a connection-reply receive failed: {}; its slot stays out of use",
                dev_.props().name, fi_strerror(-rc));
    }
  }
  tryFreeConnect(slot);
}

std::string Endpoint::handshakeState() const {
  auto name = [](SlotState st) { return st == SlotState::kFree ? "free" : st == SlotState::kQueued ? "queued" : "sent"; };
  std::string out = "connect slots:";
  for (const ConnectSlot& c : connects_) {
    if (c.commId == 0) {
      out += " free";
      continue;
    }
    out += fmt::format(" [comm {} request {}{}{}{}{}{}]", c.commId, name(c.request), c.replyPosted ? ", reply posted" : "",
                       c.replyPending ? ", reply in" : "", c.cancelling ? ", cancelling" : "", c.ended ? ", ended" : "",
                       c.error != Status::kOk ? ", failed" : "");
  }
  out += "; reply slots:";
  for (SlotState st : replySlot_) out += std::string(" ") + name(st);
  out += fmt::format("; control sends waiting: {}{}", controlQueued_ ? "yes" : "no",
                     controlRetryMs_ != 0 ? " (retried after a link error)" : "");
  return out;
}

void Endpoint::tryFreeConnect(int slot) {
  ConnectSlot& c = connects_[slot];
  if (!c.ended || c.request != SlotState::kFree || c.replyPosted) return;
  c = ConnectSlot{};
}

}  // namespace weft::fabric

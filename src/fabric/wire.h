// SPDX-License-Identifier: Apache-2.0
// Every layout the libfabric backend puts on the wire, in one place: tags, comm ids, the connection handshake and
// buffer offers, the remote completion data of RMA writes. Each field says what it holds and why its width is
// enough.
//
// Comm ids. Every comm is named by an id its own end chooses (CommIds) and tells the peer in the handshake; every
// message and offer names the id of the comm that receives it, so that comms can share one endpoint and one
// completion queue, and a late message for a closed comm is recognised instead of landing in another one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fabric/rails.h"
#include "weft/transport/net.h"

namespace weft::fabric::wire {

// 18 bits: 262,143 comms per endpoint (id 0 is never given out). NCCL opens hundreds to a few thousand net
// connections per GPU even at 1,000+ nodes; a closed comm's id is held back (quarantined) until its late traffic
// can no longer arrive, so ids are also spent by churn, which the width absorbs.
constexpr int kCommIdBits = 18;
constexpr uint32_t kMaxCommId = (1u << kCommIdBits) - 1;

// ---- tags (64 bits) ----
//
// [63] 0: NCCL data. 1: weft's own control traffic.
//
// Data: [62:45] the receiving comm's id (18 bits, above)
//       [44:22] NCCL tag (23 bits): NCCL passes the sender's rank in the top-parent communicator (tpRank) to isend
//               and the expected senders' ranks to irecv; 8,388,607 ranks is far beyond any job. A tag outside
//               [0, 2^23) is refused with an error, never folded onto another.
//       [21:0]  sequence of the message among those of its tag on its comm (22 bits, wraps). It only has to tell
//               apart the messages of one tag that can be in flight at once on one comm: NCCL keeps at most
//               NCCL_NET_MAX_REQUESTS (32) requests of up to 8 buffers per comm, 256 messages; 2^22 is 16,384
//               times that.
//
// Control: [49:32] the receiving comm's id where a receive is posted for that comm alone (connection replies:
//                  the connector's comm id), else 0: messages received by a pool of the endpoint (connection
//                  requests, offers, probes, close notices) name their comm in the body.
//          [7:0]   kind
//          every other bit 0. A connection request and reply keep exactly the tags of handshake version 3
//          (id 0, kinds 1 and 2), so that a peer of another version still gets a clean refusal.
//
// Every receive weft posts matches its tag exactly (ignore mask 0). An ignore mask is not safe on shm before
// libfabric 1.19: a message that arrived before its receive keeps the ignore mask its entry had in an earlier use
// (prov/shm/src/smr_ep.c v1.17.0, smr_get_tag leaves entry->ignore as it was; smr_match_tagged applies it), so a
// masked receive never matches such a message (offers were lost) and an exact one may match a message that is
// not its own.
constexpr uint64_t kCtrlBit = uint64_t{1} << 63;
constexpr int kNcclTagBits = 23;
constexpr int kSeqBits = 22;
constexpr uint32_t kSeqMask = (1u << kSeqBits) - 1;
constexpr int kMaxNcclTag = (1 << kNcclTagBits) - 1;

enum class CtrlKind : uint8_t { kConnRequest = 1, kConnReply = 2, kProbe = 3, kOffer = 4 };

inline bool validNcclTag(int tag) { return tag >= 0 && tag <= kMaxNcclTag; }

// ncclTag must satisfy validNcclTag and commId be at most kMaxCommId (callers check; the fields are masked here).
inline uint64_t dataTag(uint32_t commId, int ncclTag, uint32_t seq) {
  return (static_cast<uint64_t>(commId & kMaxCommId) << (kNcclTagBits + kSeqBits)) |
         (static_cast<uint64_t>(static_cast<uint32_t>(ncclTag) & kMaxNcclTag) << kSeqBits) | (seq & kSeqMask);
}
inline uint32_t dataTagComm(uint64_t tag) {
  return static_cast<uint32_t>(tag >> (kNcclTagBits + kSeqBits)) & kMaxCommId;
}
inline int dataTagNccl(uint64_t tag) { return static_cast<int>((tag >> kSeqBits) & kMaxNcclTag); }
inline uint32_t dataTagSeq(uint64_t tag) { return static_cast<uint32_t>(tag) & kSeqMask; }

inline uint64_t ctrlTag(CtrlKind kind, uint32_t commId = 0) {
  return kCtrlBit | (static_cast<uint64_t>(commId & kMaxCommId) << 32) | static_cast<uint64_t>(kind);
}
inline bool isCtrlTag(uint64_t tag) { return (tag & kCtrlBit) != 0; }
inline uint32_t ctrlTagComm(uint64_t tag) { return static_cast<uint32_t>(tag >> 32) & kMaxCommId; }
inline uint8_t ctrlTagKind(uint64_t tag) { return static_cast<uint8_t>(tag); }

// ---- handshake ----
//
//   connector --ConnectRequest{token, listen id, its comm id, its address}--> listener
//   listener  --ConnectReply{accepted | refused, the receiving comm's id}--> connector
//
// Version 4 added the listen id and the comm ids. Version 5 moved the comm id of offers, probes and close
// notices from the tag into the body (no receive uses an ignore mask; tags, above), and added the tuner's digest
// (weft/transport/agreement.h) to request and reply. Version 6 gave request, reply and offers room for 8 rails
// (NCCL 2.30's v12 devices fuse up to 8 NICs; 4 before), which moved the address in the request and the digest in
// the reply. The first fields (magic, version) never move, so a peer of another version is recognised and refused
// naming both versions (ConnectRequestV3, V4 and V5 find an older request's address; a reply to an older connector
// is sent in its own, shorter layout). A version-5 listener cannot take a version-6 request whole (it is longer than
// its buffer): the connector then fails after WEFT_CONNECT_TIMEOUT, naming no version.

// The addresses of a multi-rail device's further endpoints (rail 0's travels in the handle or the request).
template <int N>
struct RailAddrsOf {
  static constexpr size_t kMaxAddr = 64;
  uint8_t count = 1;  // rails of the sender of this message (1: a single NIC)
  uint8_t len[N] = {};
  uint8_t reserved[3] = {};
  uint8_t addr[N][kMaxAddr] = {};  // addr[0] unused
  bool valid() const {
    if (count < 1 || count > N) return false;
    for (int k = 1; k < count; ++k) {
      if (len[k] == 0 || len[k] > kMaxAddr) return false;
    }
    return true;
  }
};
using RailAddrs = RailAddrsOf<kMaxRails>;  // version 6
using RailAddrsV5 = RailAddrsOf<4>;        // versions 3 to 5

struct ConnectRequest {
  static constexpr uint32_t kMagic = 0x57465251;  // "WFRQ"
  static constexpr uint16_t kVersion = 6;
  static constexpr uint16_t kLayoutSince = 6;  // versions from this one on share this layout
  static constexpr uint32_t kFlagRdma = 1;
  static constexpr uint32_t kFlagImm4 = 2;  // this end needs the 4-byte completion-data form
  // The listener's provider reports a write's length at the target: the 4-byte form carries the comm id
  // (WriteImmId) instead of the length.
  static constexpr uint32_t kFlagLenFromCq = 4;
  // Delivery acknowledgements (AckMsg, WEFT_DELIVERY_ACK): the connector asks for them on connections of several
  // rails (kFlagAckRails) or on every connection (both flags); the reply carries kFlagAckRails where the listener
  // agreed for this connection. An older peer sets neither: no acknowledgements.
  static constexpr uint32_t kFlagAckRails = 8;
  static constexpr uint32_t kFlagAckAll = 16;
  // Rail failover (WEFT_RAIL_FAILOVER, docs/failover.md step 3): asked for by the connector, agreed by the listener
  // only with acknowledgements, the sendrecv protocol and several rails.
  static constexpr uint32_t kFlagFailover = 32;
  // Rail failover with the rdma protocol too (with kFlagFailover): the receiver can reset a failed rail's
  // connection (FabricDevice::resetsPeers) and re-offers buffers (kOfferAgain); the sender writes them again.
  static constexpr uint32_t kFlagFailoverRma = 64;
  uint32_t magic;
  uint16_t version;
  uint16_t addrLen;
  uint64_t token;
  uint32_t flags;     // kFlag*: what the connector can do
  uint32_t eagerMax;  // the connector's eager limit (bytes)
  uint32_t listenId;  // the listen this request is for (from the handle)
  uint32_t commId;    // the connector's send comm: offers and probes to it carry this id
  uint32_t reserved;
  uint64_t tunerDigest;  // the connector's tuner decision state (0: not checked)
  RailAddrs rails;    // the connector's further rails
  uint8_t addr[256];  // last: sent only up to addrLen
};

// Version 5's request, as far as a refusal needs it (its comm id and address).
struct ConnectRequestV5 {
  uint32_t magic;
  uint16_t version;
  uint16_t addrLen;
  uint64_t token;
  uint32_t flags;
  uint32_t eagerMax;
  uint32_t listenId;
  uint32_t commId;
  uint32_t reserved;
  uint64_t tunerDigest;
  RailAddrsV5 rails;
  uint8_t addr[256];
};

// Version 4's request, as far as a refusal needs it (its comm id and address).
struct ConnectRequestV4 {
  uint32_t magic;
  uint16_t version;
  uint16_t addrLen;
  uint64_t token;
  uint32_t flags;
  uint32_t eagerMax;
  uint32_t listenId;
  uint32_t commId;
  RailAddrsV5 rails;
  uint8_t addr[256];
};

// Version 3's request, as far as a refusal needs it (its address).
struct ConnectRequestV3 {
  uint32_t magic;
  uint16_t version;
  uint16_t addrLen;
  uint64_t token;
  uint32_t flags;
  uint32_t eagerMax;
  RailAddrsV5 rails;
  uint8_t addr[256];
};

enum ReplyStatus : uint16_t {
  kAccepted = 0,
  kBadToken = 1,
  kAlreadyConnected = 2,
  kBadVersion = 3,
  kNoSuchListen = 4,  // version 4: the request names a listen id this endpoint does not have
  kTunerMismatch = 5,  // version 5: the two ends' tuners would decide differently (tunerDigest)
};
const char* replyStatusName(uint16_t s);

// Same layout as version 3's reply (commId was a reserved 0 there), so a version-3 connector reads a refusal.
struct ConnectReply {
  static constexpr uint32_t kMagic = 0x57465250;  // "WFRP"
  uint32_t magic;
  uint16_t version;  // the listener's handshake version
  uint16_t status;
  uint64_t token;
  uint32_t flags;   // the agreed ConnectRequest::kFlag* (the listener's answer)
  uint32_t commId;  // the listener's receive comm: data to it carries this id
  RailAddrs rails;  // the listener's further rails; rails.count = the rails both ends use
  uint64_t tunerDigest;  // version 5: the listener's tuner decision state (0: not checked); not sent to older peers
};
// Version 5's reply (4 rails); versions 3 and 4 end before its digest.
struct ConnectReplyV5 {
  uint32_t magic;
  uint16_t version;
  uint16_t status;
  uint64_t token;
  uint32_t flags;
  uint32_t commId;
  RailAddrsV5 rails;
  uint64_t tunerDigest;
};
// What a connector of an older version receives (its reply buffer ends there): a refusal needs only the fields
// before the rails, which sit where they always did.
constexpr size_t kReplyBytesV5 = sizeof(ConnectReplyV5);
constexpr size_t kReplyBytesV4 = offsetof(ConnectReplyV5, tunerDigest);
static_assert(offsetof(ConnectReply, rails) == offsetof(ConnectReplyV5, rails), "a refusal's fields never move");
inline size_t replyBytesFor(uint16_t peerVersion) {
  return peerVersion >= ConnectRequest::kVersion ? sizeof(ConnectReply) : peerVersion == 5 ? kReplyBytesV5 : kReplyBytesV4;
}

// The address in a request of either version (version 3's sits 8 bytes earlier): a refusal goes back to it.
inline const uint8_t* requestAddr(const ConnectRequest& r) {
  if (r.version >= ConnectRequest::kLayoutSince) return r.addr;
  const size_t at = r.version == 5   ? offsetof(ConnectRequestV5, addr)
                    : r.version == 4 ? offsetof(ConnectRequestV4, addr)
                                     : offsetof(ConnectRequestV3, addr);
  return reinterpret_cast<const uint8_t*>(&r) + at;
}
// The comm id a connector of any version waits for its reply under (0 before version 4).
inline uint32_t requestComm(const ConnectRequest& r) {
  if (r.version < 4) return 0;
  return r.commId;  // at the same place in versions 4 to 6
}

// The receive buffer for a request of any version.
constexpr size_t kRequestBufBytes = std::max({sizeof(ConnectRequest), sizeof(ConnectRequestV3),
                                              sizeof(ConnectRequestV4), sizeof(ConnectRequestV5)});
static_assert(offsetof(ConnectRequest, commId) == offsetof(ConnectRequestV5, commId) &&
                  offsetof(ConnectRequest, commId) == offsetof(ConnectRequestV4, commId),
              "requestComm reads the comm id where versions 4 to 6 keep it");

// ---- probes and close notices: tag ctrlTag(kProbe), a 16-byte body {kind, comm id} ----
//
// A liveness probe names no comm (body {kProbeBody, 0}) and is drained. A send comm with endpoints of its own
// (WEFT_FABRIC_SHARED_EP=0) that NCCL closes sends on every rail a close notice (body kCloseNotice) naming the
// peer's receive comm, and keeps its endpoints until that comm answers on the same rail with a close ack (body
// kCloseAck) naming the send comm: over a byte stream the ack proves that everything sent before the notice has
// reached the peer's process (libfabric's tcp provider reports a send done once it sits in its own user-space
// buffer, which closing the endpoint throws away). An older peer drains a notice as a probe and never acks: the
// sender then keeps its endpoints for WEFT_PEER_TIMEOUT.
constexpr uint64_t kProbeBody = 0;
constexpr uint64_t kCloseNotice = 0x6e69665f74666577;  // "weft_fin"
constexpr uint64_t kCloseAck = 0x6b63615f74666577;     // "weft_ack"
// Rail failover: a send comm tells the receive comm (body[1]: its id | the rails it saw fail << 32) that it moved
// those rails' traffic to rail 0; the receiver answers with AckMsg::fenced.
constexpr uint64_t kRailDown = 0x6e64725f74666577;     // "weft_rdn"
// Re-admitting a failed-over rail (docs/failover.md, "Recovery"): body {kRailUp, comm id | rail << 24 | step << 32 |
// attempt << 40}, the comm id being the receiving end's. The send comm drives it once the receiver fenced the rail
// and its link is up: kRailHello on the rail itself; the receive comm answers kRailHelloAck on the same rail (the
// rail carries both ways); kRailReady on rail 0 asks the receiver to re-admit it, which it answers with
// AckMsg::readmit.
constexpr uint64_t kRailUp = 0x7075725f74666577;  // "weft_rup"
// The rdma protocol: a send comm NCCL closed, once none of its writes is in the provider's hands, tells the receive
// comm (body[1]: its id) on every rail that nothing more will be written. It goes after the writes on each rail, so
// the receiver has seen every write of the comm when it reads this; a receive comm closed with buffers offered stops
// holding its endpoints for them (FabricDataComm::holdForWrites). An older peer drains it as a probe.
constexpr uint64_t kWritesOver = 0x766f775f74666577;  // "weft_wov"
enum RailUpStep : uint8_t { kRailHello = 1, kRailHelloAck = 2, kRailReady = 3 };
inline uint64_t railUpWord(uint32_t commId, int rail, RailUpStep step, uint16_t attempt) {
  return (commId & 0xffffffu) | (static_cast<uint64_t>(rail & 0xff) << 24) | (static_cast<uint64_t>(step) << 32) |
         (static_cast<uint64_t>(attempt) << 40);
}
inline uint32_t railUpComm(uint64_t w) { return static_cast<uint32_t>(w & 0xffffffu); }
inline int railUpRail(uint64_t w) { return static_cast<int>((w >> 24) & 0xff); }
inline uint8_t railUpStep(uint64_t w) { return static_cast<uint8_t>((w >> 32) & 0xff); }
inline uint16_t railUpAttempt(uint64_t w) { return static_cast<uint16_t>((w >> 40) & 0xffff); }

// ---- buffer offers (rdma protocol): receiver -> sender, tag ctrlTag(kOffer), the send comm's id in the body ----

// One receive buffer as the receiver offers it.
struct OfferEntry {
  uint64_t addr[kMaxRails];  // per rail, as the sender must name it (virtual address or offset into the registration)
  uint64_t key[kMaxRails];   // per rail: remote key of the registration on that NIC
  uint64_t len;     // buffer size
  uint64_t tagSeq;  // dataTag(the receive comm's id, NCCL tag, sequence)
  uint16_t slot;    // the buffer's sequence, returned in the completion data (WriteImm)
  uint16_t flags;   // kOfferTaggedOnly: no key (unregistered buffer): send tagged whatever the size; kOfferAgain
  uint32_t reserved;
};
constexpr uint16_t kOfferTaggedOnly = 1;
// Rail failover (kFlagFailoverRma): the buffer offered again under a new slot, after a rail failed while its data
// may have been on the way. It replaces the earlier offer of the same message (same tagSeq): a send not written yet
// takes the new slot; one written (or being written) is written again, whole, under it. Writes under the old slot
// are ignored from then on.
constexpr uint16_t kOfferAgain = 2;

struct OfferMsg {
  static constexpr uint32_t kMagic = 0x57464f46;  // "WFOF"
  uint32_t magic;
  uint16_t count;
  uint8_t epoch;  // rail failover: the receiver's control-rail moves (as AckMsg::epoch; 0 before any)
  uint8_t reserved;
  uint32_t toComm;  // the send comm the offer is for
  uint32_t reserved2;
  OfferEntry entry[kMaxRecvs];
  static size_t bytes(int count) { return offsetof(OfferMsg, entry) + sizeof(OfferEntry) * count; }
};

// ---- delivery acknowledgements: receiver -> sender, tag ctrlTag(kOffer), the send comm's id in the body ----
//
// Where both ends agreed (ConnectRequest::kFlagAckRails), the receiver names every message it has taken (a tagged
// receive completed with it, or an offered buffer's last piece landed) by the low 45 bits of its data tag (NCCL
// tag and per-tag sequence: unique among the messages a comm can have in flight), in batches: one acknowledgement
// in flight per comm, the messages taken meanwhile going in the next. The sender completes a send only once its
// provider completed it and it is acknowledged. An acknowledgement shares the offers' tag and receive pool (its
// magic tells it apart) and their layout's first 16 bytes, so it fits any offer receive buffer.
// Rail failover: `fenced` names the rails the receiver has stopped receiving on (every receive it had posted
// there canceled or completed, reposted on rail 0); it rides on the acknowledgement that empties the receiver's
// queue, so every message taken on those rails has been acknowledged before or with it: the sender sends again,
// on the control rail, each send of theirs still unacknowledged.
// Control rail failover: a receiver whose control rail failed sends its acknowledgements on the lowest rail left,
// with `epoch` one more (mod 256); the sender drops any of an older epoch (sent before the move, arriving late on the
// old rail), having had their content again: the new control rail first carries the keys of the last messages
// taken, the fences and the re-admissions in force.
// Re-admission (kRailReady answered): `readmit` names the rail plus one (0: none), `alias` the comm id messages on
// that rail carry from now on (a new one each time: a copy of an earlier message left on the rail never matches),
// and the word after the keys the threshold: a message whose count (among those of its tag) is at least that
// travels on the rail again, one below it on the control rail.
constexpr uint64_t kAckKeyMask = (uint64_t{1} << (kNcclTagBits + kSeqBits)) - 1;
inline uint64_t ackKey(uint64_t dataTag) { return dataTag & kAckKeyMask; }
// The data tag an acknowledged message travels under to comm `commId` (a send sent again: rail failover).
inline uint64_t dataTagOfKey(uint32_t commId, uint64_t key) {
  return (static_cast<uint64_t>(commId & kMaxCommId) << (kNcclTagBits + kSeqBits)) | (key & kAckKeyMask);
}

struct AckMsg {
  static constexpr uint32_t kMagic = 0x5746414b;  // "WFAK"
  static constexpr int kMaxKeys = 64;
  uint32_t magic;
  uint8_t count;
  uint8_t epoch;   // rail failover: times the receiver's control rail moved (0 for an older peer: count was 16 bits)
  uint8_t fenced;  // bit per rail (above)
  uint8_t readmit;  // a rail re-admitted, plus one (above); 0: none
  uint32_t toComm;  // the send comm the acknowledgement is for (where OfferMsg::toComm is)
  uint32_t alias;   // with readmit: the comm id of the messages on that rail
  uint64_t key[kMaxKeys + 1];  // ackKey of each message taken; with readmit, then the threshold
  static size_t bytes(int count, bool readmit = false) {
    return offsetof(AckMsg, key) + sizeof(uint64_t) * (count + (readmit ? 1 : 0));
  }
};

// ---- remote completion data of RMA writes (rdma protocol) ----
//
// Every offered buffer has a sequence number of its comm's choosing (OfferEntry::slot), handed out cyclically
// and skipping those in use, so a sequence comes back only after the cursor has gone round: a late, duplicate or
// forged write naming a buffer that has moved on finds nothing. A write is cut into pieces (one per rail when
// striped; more where one length does not fit a field), each its own write carrying its own length and the
// piece count; the receiver completes the buffer when all have landed.

constexpr int kMaxPieces = 8;

// 8-byte form: [63:46] the receiving comm's id (18) | [45:36] the buffer's sequence (10) | [35] truncated |
//              [34:32] pieces - 1 (3) | [31:0] bytes of this piece (32).
// 1,024 sequences: a comm has at most 64 receive requests of up to 8 buffers offered, 512, so a sequence is
// reused only after at least 512 other offers. A piece holds at most kMaxPiece bytes, so one write carries up to
// 8 x 4 GiB - 32 KiB; NCCL's transfers are at most 1 GiB (NCCL_MAX_NET_SIZE), and a larger one is refused.
struct WriteImm {
  static constexpr uint64_t kTruncated = 1;  // flag: the message was larger than the offered buffer
  static constexpr int kSeqBits = 10;
  static constexpr uint32_t kSeqs = 1u << kSeqBits;
  static constexpr uint64_t kMaxPiece = 0xfffff000ull;  // 4 KiB aligned, fits 32 bits
  static uint64_t encode(uint32_t comm, uint32_t seq, uint64_t flags, uint64_t pieces, uint64_t bytes) {
    return (static_cast<uint64_t>(comm & kMaxCommId) << 46) | (static_cast<uint64_t>(seq & (kSeqs - 1)) << 36) |
           ((flags & 1) << 35) | (((pieces - 1) & 7) << 32) | (bytes & 0xffffffffull);
  }
  static uint32_t comm(uint64_t d) { return static_cast<uint32_t>(d >> 46) & kMaxCommId; }
  static uint32_t seq(uint64_t d) { return static_cast<uint32_t>(d >> 36) & (kSeqs - 1); }
  static uint64_t flags(uint64_t d) { return (d >> 35) & 1; }
  static uint64_t pieces(uint64_t d) { return ((d >> 32) & 7) + 1; }
  static uint64_t bytes(uint64_t d) { return d & 0xffffffffull; }
};

// 4-byte form (EFA, verbs), where the receiving provider reports a write's length in its completion entry
// (libfabric's `len` at the target; measured per device, FabricDevice::writeLenReported):
//   [31] truncated | [30:28] pieces - 1 (3) | [27:10] the receiving comm's id (18) | [9:0] the buffer's sequence (10)
// Each piece's length is its completion's. aws-ofi-nccl's layout is the same idea (segments, comm id, sequence).
struct WriteImmId {
  static constexpr uint64_t kTruncated = WriteImm::kTruncated;
  static constexpr uint32_t kSeqs = WriteImm::kSeqs;
  static uint64_t encode(uint32_t comm, uint32_t seq, uint64_t flags, uint64_t pieces) {
    return ((flags & 1) << 31) | (((pieces - 1) & 7) << 28) | (static_cast<uint64_t>(comm & kMaxCommId) << 10) |
           (seq & (kSeqs - 1));
  }
  static uint32_t comm(uint64_t d) { return static_cast<uint32_t>(d >> 10) & kMaxCommId; }
  static uint32_t seq(uint64_t d) { return static_cast<uint32_t>(d) & (kSeqs - 1); }
  static uint64_t flags(uint64_t d) { return (d >> 31) & 1; }
  static uint64_t pieces(uint64_t d) { return ((d >> 28) & 7) + 1; }
};

// 4-byte form where the receiving provider does not report the length (tcp;ofi_rxm 1.17 gives 0; it offers 8
// bytes, so this serves WEFT_CQ_DATA=4 tests and providers like it): [31:23] the buffer's sequence (9),
// [22:20] pieces - 1, [19] truncated, [18:4] m, [3:0] e; the piece holds m * 2^e bytes. 512 sequences, as many
// as a comm can have offered: an irecv finding none free is answered "try again". No comm id: a device whose
// writes need this form cannot share its endpoint among comms.
struct WriteImm32 {
  static constexpr uint64_t kMaxM = (1u << 15) - 1;
  static constexpr int kMaxE = 15;
  static constexpr int kMaxPieces = wire::kMaxPieces;
  static constexpr int kSeqBits = 9;
  static constexpr uint32_t kSeqs = 1u << kSeqBits;
  // The largest length of the form m * 2^e that is <= len (len > 0), and its encoding.
  static uint64_t largestPiece(uint64_t len, uint32_t* field) {
    int e = 0;
    while ((len >> e) > kMaxM && e < kMaxE) ++e;
    uint64_t m = std::min<uint64_t>(len >> e, kMaxM);
    *field = static_cast<uint32_t>((m << 4) | static_cast<uint64_t>(e));
    return m << e;
  }
  static uint64_t encode(uint32_t seq, uint64_t flags, uint64_t pieces, uint32_t lenField) {
    return (static_cast<uint64_t>(seq & 0x1ff) << 23) | (((pieces - 1) & 7) << 20) | ((flags & 1) << 19) |
           (lenField & 0x7ffff);
  }
  static uint32_t seq(uint64_t d) { return static_cast<uint32_t>((d >> 23) & 0x1ff); }
  static uint64_t flags(uint64_t d) { return (d >> 19) & 1; }
  static uint64_t pieces(uint64_t d) { return ((d >> 20) & 7) + 1; }
  static uint64_t bytes(uint64_t d) { return ((d >> 4) & kMaxM) << (d & 0xf); }
};

static_assert(offsetof(AckMsg, toComm) == offsetof(OfferMsg, toComm) && sizeof(AckMsg) <= sizeof(OfferMsg),
              "an acknowledgement arrives in an offer receive buffer, named like an offer");

}  // namespace weft::fabric::wire

// SPDX-License-Identifier: Apache-2.0
#include "fabric/fabric_backend.h"

#include <cstdlib>
#include <cstring>

#include "fabric/rails.h"
#include "weft/common/params.h"
#include "weft/transport/agreement.h"
#include "weft/transport/handle.h"

namespace weft::fabric {

namespace {
// Comm and listen ids of this process (fabric/wire.h). A closed comm's id is held back for the peer timeout: by
// then whatever the peer still had in flight for it has arrived or the peer was declared dead.
CommIds& commIds() {
  static CommIds ids(wire::kMaxCommId, std::chrono::seconds(params::getInt("WEFT_PEER_TIMEOUT")));
  return ids;
}
}  // namespace

CommId railAliasId() {
  CommIds& ids = commIds();
  return CommId(&ids, ids.acquire());
}

CommId FabricBackend::newCommId(const char* what, int dev) {
  CommIds& ids = commIds();
  CommId id(&ids, ids.acquire());
  if (!id) {
    WEFT_WARN("{} on {}: every comm id is taken ({} live, {} held back after close; at most {}): too many "
              "connections in this process",
              what, props(dev).name, ids.live(), ids.quarantined(), ids.maxId());
  }
  return id;
}

std::unique_ptr<FabricBackend> FabricBackend::discover(std::string* why) {
  const std::string& provider = params::getString("WEFT_PROVIDER");
  const std::string& iface = params::getString("WEFT_IFACE");
  std::vector<Candidate> found;
  std::string reasons;
  if (!provider.empty()) {
    std::string w;
    found = filterInterfaces(probe(provider, &w), iface);
    if (found.empty()) reasons = w.empty() ? "WEFT_IFACE='" + iface + "' matched none of its domains" : w;
  } else {
    for (const auto& p : defaultProviders()) {
      std::string w;
      found = filterInterfaces(probe(p, &w), iface);
      if (!found.empty()) break;
      reasons += (reasons.empty() ? "" : "; ") + p + ": " + (w.empty() ? "no domain matches WEFT_IFACE" : w);
    }
  }
  if (found.empty()) {
    *why = "no usable libfabric device (" + reasons + ")";
    return nullptr;
  }
  auto b = std::unique_ptr<FabricBackend>(new FabricBackend());
  b->maxRecvs_ = static_cast<int>(params::getInt("WEFT_MAX_RECVS"));
  b->connectTimeoutSec_ = static_cast<int>(params::getInt("WEFT_CONNECT_TIMEOUT"));
  b->sharedEndpoints_ = params::getBool("WEFT_FABRIC_SHARED_EP");
  b->pending_.setTimeout(b->connectTimeoutSec_);
  std::map<std::string, NicRail> nicRails;
  std::string railErr;
  if (!parseNicRails(params::getString("WEFT_NIC_RAILS"), &nicRails, &railErr)) {
    WEFT_WARN("WEFT_NIC_RAILS='{}': {}; rails and planes stay undefined", params::getString("WEFT_NIC_RAILS"), railErr);
    nicRails.clear();
  }
  std::vector<NicInfo> nics;
  for (auto& c : found) {
    c.props.maxRecvs = b->maxRecvs_;
    if (auto it = nicRails.find(c.props.name); it != nicRails.end()) {
      c.props.railId = it->second.rail;
      c.props.planeId = it->second.plane;
    }
    nics.push_back(NicInfo{c.props.name, c.props.pciPath, c.props.speedMbps});
    int index = static_cast<int>(b->nics_.size());
    b->nics_.push_back(std::make_unique<FabricDevice>(index, std::move(c)));
  }
  RailSpec spec;
  std::string err;
  if (!parseRailSpec(params::getString("WEFT_RAILS"), &spec, &err)) {
    WEFT_WARN("WEFT_RAILS='{}': {}; every NIC stays a device of its own", params::getString("WEFT_RAILS"), err);
    spec.mode = RailSpec::Mode::kOff;
  }
  std::vector<std::string> warnings;
  auto groups = groupRails(nics, spec.mode == RailSpec::Mode::kAuto ? topo::Topology::host() : topo::Topology(), spec,
                           &warnings);
  for (const auto& w : warnings) WEFT_WARN("{}", w);
  for (const auto& g : groups) {
    std::vector<FabricDevice*> rails;
    for (int i : g) rails.push_back(b->nics_[i].get());
    if (!b->addGroup(std::move(rails), nullptr, 0)) break;
    const int index = b->deviceCount() - 1;
    const DeviceProps& p = b->props(index);
    WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft device {}: {} via {} (fabric {}), {} Mb/s, {} rail{}, pci {}, "
              "ptrSupport {:#x}",
              index, p.name, p.provider, p.fabric, p.speedMbps, g.size(), g.size() == 1 ? "" : "s",
              p.pciPath.empty() ? "none" : p.pciPath, p.ptrSupport);
  }
  return b;
}

bool FabricBackend::addGroup(std::vector<FabricDevice*> rails, const int* vdevs, int nVdevs) {
  std::lock_guard<std::mutex> lock(groupsMutex_);
  const int n = groupCount_.load(std::memory_order_relaxed);
  if (n >= kMaxDevices) {
    WEFT_WARN("more than {} devices: the rest are left out", kMaxDevices);
    return false;
  }
  auto g = std::make_unique<Group>();
  g->props = rails[0]->props();
  DeviceProps& p = g->props;
  for (size_t k = 1; k < rails.size(); ++k) {
    const DeviceProps& q = rails[k]->props();
    p.name += "+" + q.name;
    p.speedMbps += q.speedMbps;
    p.maxComms = std::min(p.maxComms, q.maxComms);
    p.ptrSupport &= q.ptrSupport;
    p.latencyUs = std::max(p.latencyUs, q.latencyUs);
    p.maxP2pBytes = std::min(p.maxP2pBytes, q.maxP2pBytes);
    p.maxCollBytes = std::min(p.maxCollBytes, q.maxCollBytes);
    p.guid ^= q.guid * 0x9e3779b97f4a7c15ull;  // distinct from each NIC's own
    // A fused device is on a rail (plane) only if all its NICs are on the same one, as NCCL's IB transport says.
    if (q.railId != p.railId) p.railId = -1;
    if (q.planeId != p.planeId) p.planeId = -1;
  }
  p.vdevCount = nVdevs;
  for (int i = 0; i < nVdevs; ++i) p.vdevs[i] = vdevs[i];
  g->rails = std::move(rails);
  groups_[n] = std::move(g);
  groupCount_.store(n + 1, std::memory_order_release);
  return true;
}

// NCCL fuses devices it finds close together (ports of one NIC by default; NCCL_NET_FORCE_MERGE for more) and
// from then on uses only the fused ones. A fused device's rails are its members' rails, in the order given.
Status FabricBackend::makeVDevice(const int* devs, int n, int* out) {
  const int count = deviceCount();
  if (out == nullptr || devs == nullptr || n < 1 || n > 8) {
    WEFT_WARN("makeVDevice: {} devices asked for (1 to 8 expected)", n);
    return Status::kInternal;
  }
  std::vector<FabricDevice*> rails;
  for (int i = 0; i < n; ++i) {
    if (devs[i] < 0 || devs[i] >= count) {
      WEFT_WARN("makeVDevice: device {} does not exist (there are {})", devs[i], count);
      return Status::kInternal;
    }
    for (FabricDevice* r : groups_[devs[i]]->rails) {
      if (std::find(rails.begin(), rails.end(), r) != rails.end()) {
        WEFT_WARN("makeVDevice: NIC {} named twice", r->props().name);
        return Status::kInvalidUsage;
      }
      rails.push_back(r);
    }
  }
  if (static_cast<int>(rails.size()) > maxDevsPerNic()) {
    WEFT_WARN("makeVDevice: fusing these {} devices gives {} NICs; a device holds at most {} on this net table "
              "(8 on v12, 4 before; NCCL_NET_FORCE_MERGE / NCCL_NET_MERGE_LEVEL choose smaller groups)",
              n, rails.size(), maxDevsPerNic());
    return Status::kInvalidUsage;
  }
  if (!addGroup(std::move(rails), devs, n)) return Status::kInternal;
  *out = deviceCount() - 1;
  const DeviceProps& p = props(*out);
  WEFT_INFO(NCCL_INIT | NCCL_NET, "NET/weft virtual device {}: {} ({} Mb/s, {} rail{})", *out, p.name, p.speedMbps,
            railCount(*out), railCount(*out) == 1 ? "" : "s");
  return Status::kOk;
}

FabricBackend::~FabricBackend() = default;

Status FabricBackend::listen(int dev, const CommConfig& config, void* handle, ListenComm** out) {
  *out = nullptr;
  ClosingComms::poll();
  if (!validDevice(dev, "listen")) return Status::kInternal;
  if (handle == nullptr) return Status::kInternal;
  CommId id = newCommId("listen", dev);
  if (!id) return Status::kSystem;
  std::shared_ptr<EndpointGroup> group;
  if (Status st = groupFor(dev, config, &group); st != Status::kOk) return st;
  auto lock = group->lockIfShared();
  Endpoint* ep = &group->rail(0);
  if (ep->name().size() > WireHandle::kMaxAddr) {
    WEFT_WARN("provider address of {} bytes does not fit the handle", ep->name().size());
    return Status::kInternal;
  }
  if (Status st = ep->openListen(id.get()); st != Status::kOk) return st;
  WireHandle h;
  h.backend = BackendId::kFabric;
  h.providerHash = device(dev).providerHash();
  h.token = randomToken();
  h.listenId = id.get();
  h.addrLen = static_cast<uint16_t>(ep->name().size());
  std::memcpy(h.addr.data(), ep->name().data(), h.addrLen);
  h.encode(handle);
  WEFT_INFO(NCCL_NET, "listening on {} at {}", props(dev).name, ep->addrString(ep->name().data(), ep->name().size()));
  lock = {};
  *out = new FabricListenComm(std::move(group), h.token, maxRecvs_, std::move(id));
  return Status::kOk;
}

// A private group per connection, or with WEFT_FABRIC_SHARED_EP the one of this (context, device), opened on
// first use and gone when its last comm is. Tables before v11 pass no context: their comms are grouped by the
// thread that listens or connects, NCCL's proxy service thread, of which each communicator (or set of
// communicators sharing proxy resources) has one, beside the one progress thread that drives their data. One
// group per process would make every communicator's progress thread compete for it.
Status FabricBackend::groupFor(int dev, const CommConfig& config, std::shared_ptr<EndpointGroup>* out) {
  if (!sharedEndpoints_) return EndpointGroup::open(groups_[dev]->rails, out);
  thread_local char threadKey;  // a live thread's own address: distinct from every other live thread's
  std::lock_guard<std::mutex> lock(sharedMutex_);
  auto key = std::make_pair(config.scope != nullptr ? config.scope : static_cast<const void*>(&threadKey), dev);
  if (auto it = shared_.find(key); it != shared_.end()) {
    if ((*out = it->second.lock()) != nullptr) return Status::kOk;
  }
  for (auto it = shared_.begin(); it != shared_.end();) {  // forget groups that closed
    it = it->second.expired() ? shared_.erase(it) : std::next(it);
  }
  if (Status st = EndpointGroup::open(groups_[dev]->rails, out, true); st != Status::kOk) return st;
  shared_[key] = *out;
  WEFT_INFO(NCCL_NET, "shared endpoints on {}: a group opened for context {}", props(dev).name, config.scope);
  return Status::kOk;
}

void FabricBackend::releaseScope(const void* scope) {
  if (scope == nullptr) return;  // tables before v11 have no finalize (their groups are keyed by thread)
  // Send comms closed moments ago, waiting for their peers to acknowledge all they sent: a bounded wait (a peer
  // still receiving answers within a round trip; one that closed its side fails the notice at once).
  ClosingComms::drain(1000);
  std::vector<std::shared_ptr<EndpointGroup>> stillOpen;
  {
    std::lock_guard<std::mutex> lock(sharedMutex_);
    for (auto it = shared_.begin(); it != shared_.end();) {
      if (it->first.first != scope) {
        ++it;
        continue;
      }
      if (auto g = it->second.lock()) stillOpen.push_back(std::move(g));
      it = shared_.erase(it);
    }
  }
  for (const auto& g : stillOpen) {
    auto held = g->lockIfShared();
    WEFT_WARN("finalize of context {}: its endpoint group on {} still has {} comms open (not closed by NCCL); it "
              "closes with the last of them", scope, g->rail(0).device().props().name, g->table().size());
  }
}

Status FabricBackend::connect(int dev, const CommConfig& config, void* handle, SendComm** out) {
  ClosingComms::poll();
  constexpr const char* kCauses =
      "a firewall or security group dropping traffic between the nodes, or WEFT_IFACE choosing an interface the "
      "peer cannot reach";
  auto start = [&](PendingConnect& pc) {
    WireHandle h;
    if (Status st = decodeForConnect(handle, props(dev).name, BackendId::kFabric, device(dev).providerHash(),
                                     "libfabric's " + props(dev).provider, &h);
        st != Status::kOk) {
      return st;
    }
    pc.id = newCommId("connect", dev);
    if (!pc.id) return Status::kSystem;
    if (Status st = groupFor(dev, config, &pc.group); st != Status::kOk) return st;
    auto lock = pc.group->lockIfShared();  // released before pollConnect, which takes it again
    Endpoint& ep = pc.group->rail(0);
    pc.peerName = ep.addrString(h.addr.data(), h.addrLen);
    if (Status st = ep.insert(h.addr.data(), h.addrLen, &pc.peer); st != Status::kOk) return st;
    pc.token = h.token;
    pc.listenId = h.listenId;
    pc.flags = localProtocolFlags(ep.device(), pc.group->rails());
    pc.eagerMax = static_cast<uint32_t>(device(dev).eagerMax());
    return Status::kOk;
  };
  return pending_.connect(*this, dev, handle, kCauses, out, start,
                          [&](PendingConnect& pc, SendComm** o) { return pollConnect(pc, o); });
}

Status FabricBackend::pollConnect(PendingConnect& pc, SendComm** out) {
  // `keep` outlives `lock`: the group moves to the send comm below, which may go again if it fails to start.
  std::shared_ptr<EndpointGroup> keep = pc.group;
  auto lock = keep->lockIfShared();
  Endpoint& ep = pc.group->rail(0);
  const DeviceProps& p = ep.device().props();
  if (!pc.toldSlow && std::chrono::steady_clock::now() - pc.started > std::chrono::seconds(10)) {
    // Waiting on the peer (it has not accepted yet) is normal; waiting on this end (no connect slot, the request
    // not handed to the provider) is not, and says why the peer never hears of this connect.
    pc.toldSlow = true;
    const std::string state = ep.handshakeState();
    if (pc.slot < 0 || state.find("[comm " + std::to_string(pc.id.get()) + " request queued") != std::string::npos) {
      WEFT_WARN("connect to {} on {}: not handed to {} after 10 s ({}); trying until WEFT_CONNECT_TIMEOUT",
                pc.peerName, p.name, p.provider, state);
    } else {
      WEFT_INFO(NCCL_NET, "connect to {} on {}: no answer after 10 s (the peer has not accepted yet?) ({})",
                pc.peerName, p.name, state);
    }
  }
  if (pc.slot < 0) {  // every connect slot of the endpoint was busy: try again
    if (Status st = ep.startConnect(pc.id.get(), pc.peer, pc.token, pc.listenId, pc.flags, pc.eagerMax,
                                    pc.group->railAddrs(), &pc.slot);
        st != Status::kOk) {
      return st;
    }
    if (pc.slot < 0) return ep.progress();
  }
  if (Status st = ep.progress(); st != Status::kOk) return st;
  if (ep.connectError(pc.slot) != Status::kOk) {
    WEFT_WARN("connect to {} via {} on {} failed: the peer is unreachable or refused the connection (nothing "
              "listening there any more, a firewall/security group, or an interface the peer cannot reach: check "
              "WEFT_IFACE)",
              pc.peerName, p.provider, p.name);
    return ep.connectError(pc.slot);
  }
  ConnectReply reply;
  if (ep.takeReply(pc.slot, &reply)) {
    if (reply.magic != ConnectReply::kMagic || reply.token != pc.token) {
      WEFT_WARN("connect to {} on {}: ignored a reply that does not answer this connection", pc.peerName, p.name);
      if (Status st = ep.repostReplyRecv(pc.slot); st != Status::kOk) return st;
      return Status::kOk;
    }
    if (reply.status == kBadVersion) {
      WEFT_WARN("connect to {} on {}: {}: the peer speaks weft connection protocol v{}, this end v{} (run the "
                "same weft build on every node)",
                pc.peerName, p.name, replyStatusName(reply.status), reply.version, ConnectRequest::kVersion);
      return Status::kRemote;
    }
    if (reply.status == kTunerMismatch) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, p.name,
                transport::agreementMismatch(reply.tunerDigest, pc.peerName));
      return Status::kInvalidUsage;
    }
    if (reply.status != kAccepted) {
      WEFT_WARN("connect to {} on {}: {}", pc.peerName, p.name, replyStatusName(reply.status));
      return Status::kRemote;
    }
    if (reply.version != ConnectRequest::kVersion || reply.commId == 0 || reply.commId > wire::kMaxCommId) {
      WEFT_WARN("connect to {} on {}: the reply (version {}) names comm id {}, outside [1, {}]", pc.peerName, p.name,
                reply.version, reply.commId, wire::kMaxCommId);
      return Status::kRemote;
    }
    if (!reply.rails.valid() || reply.rails.count > pc.group->rails()) {
      WEFT_WARN("connect to {} on {}: the reply names {} rails, this device has {}", pc.peerName, p.name,
                reply.rails.count, pc.group->rails());
      return Status::kRemote;
    }
    Protocol proto;
    proto.rdma = (reply.flags & pc.flags & ConnectRequest::kFlagRdma) != 0;
    proto.imm4 = proto.rdma && (reply.flags & ConnectRequest::kFlagImm4) != 0;
    proto.immId = proto.imm4 && (reply.flags & ConnectRequest::kFlagLenFromCq) != 0;
    proto.eagerMax = proto.rdma ? static_cast<uint32_t>(ep.device().eagerMax()) : 0;
    proto.acks = (reply.flags & pc.flags & ConnectRequest::kFlagAckRails) != 0;
    proto.failover = proto.acks && (reply.flags & pc.flags & ConnectRequest::kFlagFailover) != 0 &&
                     (!proto.rdma || (reply.flags & pc.flags & ConnectRequest::kFlagFailoverRma) != 0);
    const int nRails = reply.rails.count;
    std::vector<Rail> rails(nRails);
    rails[0].peer = pc.peer;
    for (int k = 1; k < nRails; ++k) {
      if (Status st = pc.group->rail(k).insert(reply.rails.addr[k], reply.rails.len[k], &rails[k].peer);
          st != Status::kOk) {
        return st;
      }
    }
    ep.endConnect(pc.slot);
    pc.slot = -1;
    pc.group->keepRails(nRails);
    for (int k = 0; k < nRails; ++k) rails[k].ep = &pc.group->rail(k);
    WEFT_INFO(NCCL_NET, "connected to {} on {} via {} ({} protocol, eager up to {} B, {} rail{}{}{})", pc.peerName,
              p.name, p.provider, protocolName(proto), proto.eagerMax, nRails, nRails == 1 ? "" : "s",
              proto.acks ? ", delivery acknowledgements" : "", proto.failover ? ", rail failover" : "");
    const int node = rails[0].ep->device().props().numaNode;
    std::unique_ptr<FabricSendComm> sc(numa::make<FabricSendComm>(node, std::move(pc.group), std::move(rails),
                                                                   pc.peerName, maxRecvs_, proto, std::move(pc.id),
                                                                   reply.commId));
    if (Status st = sc->start(); st != Status::kOk) return st;
    *out = sc.release();
    return Status::kOk;
  }
  return Status::kOk;
}

// Process-wide counts of the backend's endpoints (every comm of this process, whichever device).
bool FabricBackend::stat(std::string_view key, long long* value) const {
  static constexpr std::pair<std::string_view, int64_t (*)()> kStats[] = {
      {"fabric.endpoints_open", &Endpoint::openCount},
      {"fabric.probes_sent", &Endpoint::probesSent},
      {"fabric.stalls", &Endpoint::stalls},
      {"fabric.rail_downs", &Endpoint::railDowns},
      {"fabric.rail_recoveries", &Endpoint::railRecoveries},
      {"fabric.rail_failovers", &Endpoint::railFailovers},
      {"fabric.moved_messages", &Endpoint::movedMessages},
      {"fabric.rail_readmits", &Endpoint::railReadmits},
      {"fabric.peer_resets", &Endpoint::peerResets},
      {"fabric.flush_reads", &Endpoint::flushReads},
      {"flush_reads", &Endpoint::flushReads}};
  for (const auto& [name, get] : kStats) {
    if (key != name) continue;
    *value = get();
    return true;
  }
  return false;
}

std::string FabricBackend::describe(int dev) const {
  const FabricDevice& d = device(dev);
  return fmt::format("rails {}  protocol {} (eager <= {} B)", railCount(dev),
                     d.rdma() ? (d.compactImm() ? "rdma(cq4)" : "rdma") : "sendrecv", d.rdma() ? d.eagerMax() : 0);
}

}  // namespace weft::fabric

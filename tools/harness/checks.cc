// SPDX-License-Identifier: Apache-2.0
#include "checks.h"

#include "checks_internal.h"

namespace weft::harness {

using namespace checks;

const std::vector<Check>& allChecks() {
  static const std::vector<Check> kChecks = {
      {"init.idempotent", "init runs again (another communicator) without changing devices; v11 finalize(NULL) ok",
       initIdempotent},
      {"devices.properties", "every device's properties are what NCCL's topology code accepts", devicesProperties},
      {"connect.two_process", "listen/handle/connect/accept across processes, each call non-blocking",
       connectTwoProcess},
      {"connect.nonblocking", "connect returns while the peer withholds accept, accept returns (no comm) while the "
       "peer withholds connect", connectNonblocking},
      {"connect.self_one_thread", "connect to our own listen from one thread, then a message to self", connectSelf},
      {"listen.close_unaccepted", "listen comms closed without a connection, after fruitless accepts",
       listenCloseUnaccepted},
      {"data.sizes", "0 B to 4 MiB+3, receive exactly the send size, sizes reported, bytes verified", dataSizes, true},
      {"data.recv_larger", "receives larger than the send report the real size", dataRecvLarger, true},
      {"api.set_net_attr", "setNetAttr (v11+, optional) at connect and before each transfer: accepted, data unchanged",
       apiSetNetAttr},
      {"data.nccl_steps", "NCCL step patterns (SIMPLE ring/tree, LL, LL128, P2P) with NCCL_STEPS in flight",
       dataNcclSteps, true},
      {"data.request_hint", "irecv overwrites *request preset to NCCL_NET_OPTIONAL_RECV_COMPLETION (v9+)",
       dataRequestHint, true},
      {"data.grouped_receives", "irecv of n<=maxRecvs buffers, sends in any tag order, per-buffer sizes",
       dataGroupedReceives, true},
      {"data.grouped_skew", "PXN subs of one grouped receive out of step: one sub NCCL_STEPS ahead of another, whose "
       "step 0 its group waits for, still delivers (held aside or refused until posted)", dataGroupedSkew, true},
      {"data.max_requests", "32 receives outstanding on one comm, matched in posting order", dataMaxRequests, true},
      {"data.send_larger_than_recv", "a send larger than its receive: an error, or a completion truncated to the "
       "receive's size (NCCL's IB transport); never a byte past the receive buffer", dataSendLargerThanRecv},
      {"data.large_1GiB", "one 1 GiB message, verified", dataLarge},
      {"mr.cache", "same range registered twice; sub-range transfers; deregister in any order", mrCache},
      {"threads.service_and_progress", "regMr/deregMr/listen on the service thread while data flows", threadsServiceAndProgress},
      {"comms.many", "8 connections progressed round-robin from one thread", commsMany},
      {"comms.scale", "N connections (1,024; 256 with --quick; --conns) held at once, one message each: connect time, "
       "RSS and fds per connection printed", commsScale},
      {"comms.cross_order", "N connections (2,048; --conns), every receive posted before any send and in the "
       "reverse of the send order: every message arrives intact", commsCrossOrder},
      {"teardown.inflight", "deregMr and close with requests in flight (communicator abort)", teardownInflight},
      {"teardown.close_then_reconnect", "a comm closed with 8 MiB in flight, a new one at once: no old byte lands "
       "in the new comm's buffers", teardownCloseThenReconnect},
      {"teardown.close_after_sends", "16 senders close their comms the moment their last sends complete, the "
       "receiver still behind: every byte arrives", teardownCloseAfterSends},
      {"hygiene.connect_cycles", "many listen/connect/accept/close cycles leave no fds or memory behind",
       hygieneConnectCycles},
      {"hygiene.register_cycles", "many regMr/deregMr cycles leave no fds or memory behind", hygieneRegisterCycles},
      {"faults.sender_killed", "the sending process is SIGKILLed: pending receives fail within a bound, other connections keep working (alone)",
       faultsSenderKilled},
      {"faults.flush_peer_killed", "the sending process is SIGKILLed after a receive: a flush of it ends (error or "
       "completion) within a bound, before and after the comm failed; weft fails the second (alone)",
       faultsFlushPeerKilled, true},
      {"faults.receiver_killed", "the receiving process is SIGKILLed: pending sends fail within a bound, other connections keep working (alone)",
       faultsReceiverKilled},
      {"faults.killed_many", "the sending process, holding N connections (256; 64 with --quick; --conns), is SIGKILLed: "
       "all of them fail within a bound, the receiver's other connections keep carrying intact data (alone)",
       faultsKilledMany},
      {"profiler.net_events", "net-plugin profiler events (v10+): never a NULL pHandle, each started event stopped once",
       profilerNetEvents},
      {"faults.link_down", "the link goes down mid-stream: pending requests fail within a bound; back up, a new "
       "connection works (alone, under netns_conformance.sh --link-down)", faultsLinkDown},
      {"faults.rail_down", "one of two rails goes down mid-stream: pending striped requests end within a bound "
       "(intact, or failed); weft counts the rail down; back up, a new connection works (alone, under "
       "netns_conformance.sh --rails explicit --link-down)", faultsRailDown},
      {"faults.rail_flap_soak", "soak.random while one of two rails flaps (down 0.8 s every 2 s): every byte checked, "
       "every request ends (alone, under netns_conformance.sh --rails explicit --link-down)", faultsRailFlapSoak},
      {"faults.rails_all_down", "every rail of a multi-rail device goes down with requests pending: they end within a "
       "bound (fail, where the plugin moves traffic between rails); back up, a new connection works (alone, under "
       "netns_conformance.sh --rails explicit --link-down)", faultsRailsAllDown},
      {"soak.random", "16 connections, grouped receives of random sizes and tags in shuffled send order, every byte "
       "checked (--soak N messages)", soakRandom, true},
      {"diff.stream", "8 interleaved connections of seeded groups (4 with --quick): sizes reported and bytes up to 64 "
       "past each message recorded, not judged (weft diff compares two plugins' traces)", diffStream},
      {"weft.context_per_init", "v11+: every init gives a context of its own, non-NULL; each finalizes alone",
       weftContextPerInit},
      {"weft.distinct_handles", "the same range registered twice gives two handles, deregistered in any order",
       weftDistinctHandles},
      {"weft.send_larger_than_recv", "a send larger than its receive fails the receive with ncclInvalidUsage, "
       "never a silently truncated message", weftSendLargerThanRecv},
      {"weft.delivery_ack", "under WEFT_DELIVERY_ACK a send is not done before the receiver took it: withheld "
       "(no receive, no call), none of its small sends completes; released, all do, intact", weftDeliveryAck},
      {"weft.iflush_host", "iflush on host memory (never asked by NCCL): NULL request or one that completes",
       weftIflushHost},
      {"weft.flush", "under WEFT_FLUSH=all a flush of a received buffer returns a request, an empty one none; "
       "64 flushes in flight (32 per comm) complete, and the comms carry data after", weftFlush, true},
      {"weft.wrong_token", "a handle with a wrong token is refused with a warning; the real one still connects",
       weftWrongToken},
      {"weft.replayed_handle", "a second connect to a used handle is refused; the first connection still works",
       weftReplayedHandle},
      {"weft.tcp_flows", "TCP backend: one flow while a connection carries small messages; a large transfer spread "
       "over several, each with a fair part of the bytes (--min-flows, WEFT_TCP_FLOWS); a later connection's first "
       "bulk message on as many flows as the first found",
       weftTcpFlows},
      {"weft.stall_lines", "a connection waiting with no byte moving for WEFT_STALL_S warns once: a receive whose "
       "send is posted late says the peer has not posted it, a send whose receive is posted late that the peer "
       "reads nothing; both arrive intact after", weftStallLines},
      {"weft.hang_report", "a receiver stuck in its application, then SIGTERM: both processes' dumps name it in weft "
       "report --hangs as where the waits end; its own SIGTERM handler still runs (WEFT_TELEMETRY_DIR, WEFT_STALL_S)",
       weftHangReport},
      {"weft.hang_cycle", "each rank sends 64 MiB to the other before posting its receive: both stall dumps name "
       "the cycle in weft report --hangs; both arrive intact once the receives are posted (WEFT_TELEMETRY_DIR, "
       "WEFT_STALL_S)",
       weftHangCycle},
      {"weft.unreachable_peer", "connect to a closed listen or a silent listener fails within WEFT_CONNECT_TIMEOUT",
       weftUnreachablePeer},
      {"weft.misuse", "double close and deregister, test after completion, NULL out-pointers, foreign memory "
       "handles, comms of the wrong kind: errors with warnings, never a crash", weftMisuse},
      {"weft.garbage_handles", "garbage handles and foreign objects get ncclInvalidUsage/errors, never a crash",
       weftGarbageHandles},
  };
  return kChecks;
}

}  // namespace weft::harness

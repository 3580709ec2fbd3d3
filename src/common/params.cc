// SPDX-License-Identifier: Apache-2.0
#include "weft/common/params.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <atomic>
#include <mutex>

#include "weft/common/status.h"

extern char** environ;

namespace weft::params {
namespace {

// clang-format off
const std::vector<Def> kDefs = {
  {"WEFT_BACKEND", Kind::kChoice, "auto", 0, 0, "auto|verbs|fabric|tcp",
   "Transport: verbs = native ibverbs (InfiniBand, RoCE); fabric = libfabric; tcp = weft's own TCP sockets (as "
   "many flows a connection as the NIC needs, moved on NCCL's thread or by WEFT_TCP_THREADS helpers; host memory "
   "only); auto = verbs where an active InfiniBand "
   "or RoCE port exists (after WEFT_IB_HCA), else tcp where libfabric has no hardware provider (efa, "
   "verbs;ofi_rxm) and WEFT_PROVIDER is unset, else libfabric. A forced backend that finds no device declines "
   "(NCCL uses its own transports) rather than falling back."},
  {"WEFT_IB_HCA", Kind::kString, "", 0, 0, nullptr,
   "verbs: which HCA ports become NCCL devices, NCCL_IB_HCA syntax: comma-separated device names with an "
   "optional :port (mlx5_0:1,mlx5_1), '^' to exclude, '=' for exact names (prefixes otherwise). Empty: every "
   "active port. As in NCCL 2.30, name:port:rail:plane also gives the port's rail and plane to NCCL's rail-aware "
   "search (v12 railId/planeId; empty fields undefined)."},
  {"WEFT_IB_GID_INDEX", Kind::kInt, "-1", -1, 1023, nullptr,
   "verbs, RoCE: GID index to use. -1: the RoCEv2 GID of an IPv4 address (IPv4-mapped), else any RoCEv2 GID, "
   "else RoCEv1."},
  {"WEFT_IB_TC", Kind::kInt, "-1", -1, 255, nullptr,
   "verbs: traffic class of the GRH (RoCE DSCP << 2). -1: NCCL's per-communicator traffic class where given, "
   "else 0."},
  {"WEFT_IB_SL", Kind::kInt, "0", 0, 15, nullptr, "verbs: InfiniBand service level of every QP."},
  {"WEFT_IB_QPS_PER_CONN", Kind::kInt, "1", 1, 8, nullptr,
   "verbs: reliable-connected QPs per connection; messages of at least WEFT_STRIPE_MIN bytes are split across "
   "them (also spreads RoCE traffic over ECMP paths)."},
  {"WEFT_IB_TIMEOUT", Kind::kInt, "18", 1, 31, nullptr,
   "verbs: QP local ACK timeout exponent (4.096 us x 2^n per try); with WEFT_IB_RETRY_CNT it bounds how long a "
   "write to a dead peer is retried before it fails (18: about 1 s per try)."},
  {"WEFT_IB_RETRY_CNT", Kind::kInt, "7", 0, 7, nullptr, "verbs: QP transport retries before a send fails."},
  {"WEFT_PROVIDER", Kind::kString, "", 0, 0, nullptr,
   "libfabric provider to use, e.g. 'tcp;ofi_rxm', 'shm', 'efa', 'verbs;ofi_rxm'. Empty: the best available "
   "(efa, verbs;ofi_rxm, tcp;ofi_rxm, tcp, sockets)."},
  {"WEFT_IFACE", Kind::kString, "", 0, 0, nullptr,
   "Which NICs/domains become NCCL devices: comma-separated name prefixes, '^' to exclude, '=' for exact names "
   "(NCCL_SOCKET_IFNAME syntax). Empty: every domain except loopback and container bridges (loopback is used "
   "only when nothing else exists)."},
  {"WEFT_RMA", Kind::kChoice, "auto", 0, 0, "auto|on|off|fabric|tcp|verbs",
   "NCCL's device API through its CPU proxy (the GIN v11-v12 and RMA v13-v17 tables in libnccl-net-weft.so): auto = "
   "over the net backend's own transport for libfabric (RMA writes and reads on WEFT_PROVIDER's devices, or weft's "
   "TCP sockets where a provider over TCP cannot reach GPU memory and a GPU is present) and tcp (weft's sockets); "
   "beside verbs none (NCCL's own InfiniBand GIN serves it); on = the net backend's own transport (verbs: RDMA "
   "writes, reads and atomics on weft's QPs), weft's sockets where there is none; fabric, tcp or verbs = that "
   "transport whatever the net backend; off = 0 devices, NCCL looks elsewhere."},
  {"WEFT_RMA_SIGNAL", Kind::kChoice, "auto", 0, 0, "auto|atomic|message",
   "Device API over native verbs: how a signal reaches its target. atomic = an RDMA fetch-and-add on the signal word "
   "after the put's write on the same QP (the target's CPU takes no part); message = a 64-byte send after the write, "
   "applied by the target's proxy; auto = atomic where the device has atomics."},
  {"WEFT_RMA_INJECT", Kind::kBool, "1", 0, 1, nullptr,
   "Device API over libfabric: send weft's own 64-byte messages (signals, window records) with fi_tinject where the "
   "provider's inject size holds them (no completion to wait for); 0 = sends with completions, each held in one of "
   "256 slots a comm."},
  {"WEFT_TCP_SOCKBUF", Kind::kInt, "0", 0, 1 << 30, nullptr,
   "Native TCP backend: SO_SNDBUF and SO_RCVBUF of every data socket, in bytes (the kernel doubles the value and "
   "caps it at net.core.wmem_max/rmem_max). 0: the kernel's autotuning (net.ipv4.tcp_wmem/tcp_rmem), which grows "
   "a busy connection's buffers to its bandwidth-delay product and keeps an idle one small."},
  {"WEFT_TCP_FLOWS", Kind::kInt, "0", 0, 64, nullptr,
   "Native TCP backend: TCP flows (sockets) per interface in every connection, at most 64 a connection (a fused "
   "device's interfaces together). Flow 0 carries the message headers and every message below WEFT_STRIPE_MIN "
   "bytes; a larger one is cut into WEFT_TCP_CHUNK pieces the flows take as they have room. 0: from the NIC's PCI "
   "vendor, for clouds that cap each flow (16 on AWS ENA, 8 on Azure MANA, 4 on Google gVNIC and virtio-net); on "
   "any other NIC each connection grows from one flow an interface, x4 while that adds 10% or more, up to 16 (a "
   "device's later connections start where its last grown one stopped); 1 on loopback."},
  {"WEFT_TCP_RMA_FLOWS", Kind::kInt, "0", 0, 64, nullptr,
   "The device API over weft's TCP sockets (WEFT_RMA): TCP flows between two ranks. 1: one socket carries every "
   "operation in order. N > 1: a control flow (every frame, in order) and N data flows that carry puts of "
   "WEFT_STRIPE_MIN bytes and more as WEFT_TCP_CHUNK pieces, taken as each flow has room; the target applies "
   "nothing after such a put before all its pieces are in, so the order holds. 0: as the device's net connections "
   "(WEFT_TCP_FLOWS, else the NIC's PCI vendor; 4 on a NIC weft does not know, 1 on loopback). At most 2048 sockets "
   "a comm: fewer data flows on large comms."},
  {"WEFT_TCP_NOTSENT_LOWAT", Kind::kInt, "262144", 0, 1 << 30, nullptr,
   "Native TCP backend, connections of several flows: TCP_NOTSENT_LOWAT on each flow's socket, in bytes: the "
   "kernel takes no more from a flow while this much of it is unsent, so pieces go to the flows whose path "
   "drains and a message header on flow 0 never waits behind megabytes of buffered pieces. 0: off (the kernel's "
   "buffers fill to their autotuned size)."},
  {"WEFT_TCP_THREADS", Kind::kInt, "0", 0, 16, nullptr,
   "Native TCP backend: helper threads per device that move the sockets of a connection's piece flows (flows 1 "
   "and up), bound near the NIC's NUMA node, so that several cores copy a connection's bytes. 0: every flow moves "
   "on NCCL's proxy thread (the default until a many-core host measures a gain, docs/tcp.md)."},
  {"WEFT_TCP_CHUNK", Kind::kInt, "131072", 4096, 1 << 30, nullptr,
   "Native TCP backend, several flows: bytes a piece of a large message carries; each flow takes the next piece "
   "when its socket has room, so a flow on a slower path carries less."},
  {"WEFT_TCP_BUSY_POLL", Kind::kInt, "0", 0, 1000000, nullptr,
   "Native TCP backend: SO_BUSY_POLL on every data socket, in microseconds: a recv that finds nothing polls the "
   "NIC's queue that long instead of returning (NICs with NAPI busy polling; needs CAP_NET_ADMIN above "
   "net.core.busy_read; warned about once when refused). 0: off. Not measurable on loopback or veth."},
  {"WEFT_TCP_MAX_RECVS", Kind::kInt, "8", 1, 8, nullptr,
   "Native TCP backend: maxRecvs reported to NCCL (WEFT_MAX_RECVS is the other backends'): buffers one grouped irecv "
   "may carry (PXN aggregation). A message whose receive is not posted yet (a PXN sub ahead of its group) is held "
   "aside, up to 64 MiB a comm. 1: no grouping, as NCCL's Socket transport."},
  {"WEFT_TCP_WRITE_MAX", Kind::kInt, "524288", 4096, 1 << 30, nullptr,
   "Native TCP backend: bytes one sendmsg offers the kernel at most (queued messages go out together up to this). "
   "One write of several queued MiB measured half the bandwidth of 512 KiB writes on loopback."},
  {"WEFT_MAX_RECVS", Kind::kInt, "8", 1, 8, nullptr,
   "maxRecvs reported to NCCL: buffers one grouped irecv may carry (PXN aggregation). 1 turns grouping off."},
  {"WEFT_CONNECT_TIMEOUT", Kind::kInt, "120", 0, 86400, nullptr,
   "Seconds a connect may wait for the peer's accept before failing with an error that names the peer. 0: wait "
   "forever (NCCL's own behaviour)."},
  {"WEFT_PROBE_INTERVAL", Kind::kInt, "1000", 0, 3600000, nullptr,
   "Milliseconds a connection may have requests outstanding with nothing completing before weft sends its peer "
   "a liveness probe (a dead peer process then fails the requests at once). 0: never probe."},
  {"WEFT_STALL_S", Kind::kInt, "30", 0, 86400, nullptr,
   "Seconds a connection may have requests outstanding with no byte moving before NCCL's log gets one warning for "
   "the stall (what it waits for, and whether the peer has not posted its side, the bytes stopped mid-message, or "
   "the peer is gone; docs/hangs.md), and an INFO line when bytes move again. The device API's comms warn the "
   "same way for a peer their operations wait on. 0: no stall lines."},
  {"WEFT_PEER_TIMEOUT", Kind::kInt, "10", 1, 86400, nullptr,
   "Seconds a liveness probe may stay undelivered before the peer counts as unreachable (host or link down) and "
   "the connection's requests fail with ncclRemoteError."},
  {"WEFT_FABRIC_SHARED_EP", Kind::kBool, "1", 0, 1, nullptr,
   "libfabric: the connections of one NCCL context on one device share one endpoint per NIC (and its completion "
   "queue and address vector) instead of opening their own: a connection then costs its buffers, not an "
   "endpoint. 0: an endpoint per connection (a group of one comm, no lock): the rdma protocol on a provider with "
   "4-byte completion data and no write lengths needs it (shared endpoints carry those connections with sendrecv)."},
  {"WEFT_INJECT", Kind::kBool, "1", 0, 1, nullptr,
   "Send messages up to the provider's inject size with fi_tinject (complete at once, no completion entry), "
   "on providers that transmit without further progress calls (verbs, automatic progress)."},
  {"WEFT_PROTOCOL", Kind::kChoice, "auto", 0, 0, "auto|rdma|sendrecv",
   "Data protocol: rdma = the receiver sends its buffer address and the sender writes into it (RMA with remote "
   "completion data; zero-copy on RDMA NICs); sendrecv = tagged messages only. auto = rdma on hardware providers "
   "(efa, verbs, cxi, opx, psm3) that offer RMA with 8 bytes of completion data, else sendrecv (software "
   "providers move RMA through the same stream; measured no faster). Both ends agree on the protocol at connect."},
  {"WEFT_RAIL_FAILOVER", Kind::kBool, "0", 0, 1, nullptr,
   "Rail failover (libfabric backend, experimental; the rdma protocol: WEFT_RAIL_FAILOVER_RMA): when a rail of a multi-rail connection "
   "fails (link down, failed operation, lost probe), its traffic moves to the lowest rail left and what it had in "
   "flight is sent again there, instead of the connection failing (the first rail's control traffic moves too). "
   "Turns on delivery acknowledgements on such connections (as WEFT_DELIVERY_ACK=rails, which it needs); both ends "
   "must ask for it. With no rail left the connection fails, as without it. A failed rail is taken back once it "
   "works again (WEFT_RAIL_READMIT; docs/failover.md)."},
  {"WEFT_RAIL_FAILOVER_RMA", Kind::kChoice, "auto", 0, 0, "auto|on|off",
   "Rail failover with the rdma protocol (WEFT_RAIL_FAILOVER=1): the receiving end closes a failed rail's "
   "connection to the sender, so that no RMA write it held can land later in a buffer NCCL reused, offers its "
   "waiting buffers again and the sender writes them again. auto = where closing is safe: rxm over verbs "
   "(verbs;ofi_rxm); on = rxm over tcp too, for tests (libfabric 1.17's rxm crashes when it closes a connection "
   "with an RMA write half received); off = never. Where it does not apply, WEFT_PROTOCOL=auto takes sendrecv for "
   "connections of several rails under WEFT_RAIL_FAILOVER=1, and an explicit rdma keeps rdma without failover."},
  {"WEFT_RAIL_READMIT", Kind::kInt, "1000", 0, 30000, nullptr,
   "Rail failover: milliseconds after a rail failed over before the connection tries to take it back (its link "
   "up, a round trip on it answered, then both ends agree from which message on it carries traffic again). The "
   "wait doubles with each try that fails and each failure within a minute of a re-admission, up to 30 s. 0: a "
   "failed rail stays failed over for the rest of the connection."},
  {"WEFT_DELIVERY_ACK", Kind::kChoice, "off", 0, 0, "off|rails|all",
   "Delivered-before-done sends (libfabric backend): the receiver acknowledges every message it has taken (weft's "
   "own acknowledgements on the first rail, those of one batch of completions together), and a send completes only once "
   "acknowledged, so that a send reported done is known to have reached the peer's process (what moving traffic "
   "off a failed rail needs, docs/failover.md). rails = on connections of several rails, all = on every "
   "connection, off = never. Both ends must ask for it (the lesser setting wins). Costs a round trip of "
   "completion latency per message."},
  {"WEFT_EAGER_MAX", Kind::kInt, "-1", -1, 1 << 20, nullptr,
   "With the rdma protocol, messages up to this many bytes are sent at once as tagged messages, without "
   "waiting for the receiver's buffer offer. -1: the built-in default (16384); 0: never."},
  {"WEFT_RAILS", Kind::kString, "auto", 0, 0, nullptr,
   "Which NICs form one NCCL device (rails): auto = from the machine's layout (hwloc): NICs of equal speed on the "
   "same PCIe switch or root port as their nearest GPUs, divided among those GPUs, each GPU's share of two or more "
   "one device (p5-class: four EFA a GPU; one NIC a GPU stays alone; docs/topology.md); "
   "off = every NIC its own device; or groups such as eth0+eth1,eth2+eth3 (NICs joined by '+', groups by ','; "
   "at most 8 per device with NCCL's v12 net table (NCCL 2.30+), 4 with older ones; NICs not named stay alone). "
   "Both ends of a connection use the rails both have."},
  {"WEFT_TOPOLOGY_XML", Kind::kString, "", 0, 0, nullptr,
   "The machine's layout from this hwloc XML file (lstopo --of xml) instead of the running system: GPUs, NICs, "
   "PCIe switches, NUMA nodes and their cores (hwloc's own HWLOC_XMLFILE works too). A file from another machine "
   "informs WEFT_RAILS=auto, the map in weft info and the records, but binds no memory or thread. A file hwloc "
   "cannot read gives a warning and weft goes on without a layout."},
  {"WEFT_NUMA", Kind::kChoice, "auto", 0, 0, "auto|on|off",
   "Host memory on the NIC's NUMA node (comms, their requests, staging buffers; mbind, preferred) and weft's own "
   "thread (the telemetry writer) on cores near the first NIC that no other thread of the process is pinned to. "
   "auto = on a machine of several NUMA nodes whose layout hwloc read from the running system; on = wherever the "
   "layout is this system's, one node too (tests, benchmarks); off = neither."},
  {"WEFT_NIC_RAILS", Kind::kString, "", 0, 0, nullptr,
   "libfabric NICs' rail and plane for NCCL 2.30's rail-aware search (v12 railId/planeId): NIC:rail[:plane],... "
   "(e.g. rdmap16s27:0,rdmap32s27:1); NICs not named, and fused devices whose NICs differ, leave them undefined. "
   "The verbs backend takes them from WEFT_IB_HCA (name:port:rail:plane, as NCCL_IB_HCA in 2.30)."},
  {"WEFT_STRIPE_MIN", Kind::kInt, "262144", 4096, int64_t{1} << 40, nullptr,
   "On a multi-rail device with the rdma protocol, messages of at least this many bytes are split across all "
   "rails; smaller ones (and every tagged message) go to one rail, round-robin. Native TCP: messages of at least "
   "this many bytes are cut into pieces over the flows (WEFT_TCP_FLOWS, fused interfaces); smaller ones go whole "
   "on the first."},
  {"WEFT_CQ_DATA", Kind::kChoice, "auto", 0, 0, "auto|4",
   "Remote completion data of the rdma protocol: auto = 8 bytes where the provider carries them, the compact "
   "4-byte form where it carries only 4 (EFA, verbs); 4 = the compact form everywhere (tests that path)."},
  {"WEFT_GDR", Kind::kChoice, "auto", 0, 0, "auto|0|1",
   "Advertise GPU memory (NCCL_PTR_CUDA) support: auto = when built with CUDA and the device can register it "
   "(libfabric: FI_HMEM and RMA reads; verbs: nvidia-peermem, or DMA-BUF, which adds NCCL_PTR_DMABUF); 0 = never; "
   "1 = insist: a warning says why a device cannot, and verbs devices advertise it with a CUDA driver present "
   "even where no peer-memory module is seen (registrations then fail, each with a warning, if nothing pins GPU "
   "pages)."},
  {"WEFT_FLUSH", Kind::kChoice, "auto", 0, 0, "auto|all",
   "Flush after a receive into GPU memory (NCCL asks where the GPU needs it: before Hopper, or a NIC with "
   "forceFlush): an RMA read of one byte of the received buffer, on every rail, into host memory, as NCCL's IB "
   "transport does. auto = for GPU buffers; all = for host buffers too (tests the flush path where there is no GPU)."},
  {"WEFT_TIMING", Kind::kChoice, "coll", 0, 0, "coll|1|0|proxy|net",
   "Per-collective timing through NCCL's profiler interface: coll (= 1) records every collective and p2p "
   "operation with GPU kernel time (NCCL 2.27+); proxy adds NCCL's proxy ops and steps (bytes and step latency per "
   "peer); net adds the network events net plugins report; 0 turns timing off."},
  {"WEFT_TELEMETRY_DIR", Kind::kString, "", 0, 0, nullptr,
   "Directory for the timing records: one JSON-lines file per process, weft-<host>-<pid>.jsonl (created if "
   "missing). Empty: no files (the summary at communicator finalize is still logged)."},
  {"WEFT_PROM_FILE", Kind::kString, "", 0, 0, nullptr,
   "Prometheus text file (node-exporter textfile collector) rewritten with the timing aggregates; %p in it is the "
   "process's pid (one file per rank of a node, e.g. /var/lib/node_exporter/weft-%p.prom); empty: none."},
  {"WEFT_INSPECT", Kind::kBool, "1", 0, 1, nullptr,
   "A local socket (WEFT_INSPECT_DIR/<pid>-<pid namespace>.sock) through which `weft inspect` reads this "
   "process's weft connections live: what they moved, their stalls; only this user can read it, nothing listens "
   "on the network (docs/hangs.md). 0: none."},
  {"WEFT_DUMP_ON_TERM", Kind::kBool, "1", 0, 1, nullptr,
   "At SIGTERM (the launcher ending a hung job), write this process's inspect dump into WEFT_TELEMETRY_DIR/hangs "
   "(at most 2 s), then do what the signal would have done. Needs WEFT_TELEMETRY_DIR and WEFT_INSPECT; a handler "
   "installed later (by the application) replaces weft's (docs/hangs.md). 0: weft leaves SIGTERM alone."},
  {"WEFT_INSPECT_DIR", Kind::kString, "", 0, 0, nullptr,
   "The folder of the `weft inspect` sockets; it must be this user's alone (made 0700). Empty: /tmp/weft-<uid>."},
  {"WEFT_PROM_INTERVAL", Kind::kInt, "30", 1, 86400, nullptr,
   "Seconds between rewrites of WEFT_PROM_FILE (also written at communicator finalize and at exit)."},
  {"WEFT_PROM_TAGS", Kind::kInt, "8", 0, 256, nullptr,
   "User tags (NCCL 2.32+) that get their own label in WEFT_PROM_FILE's weft_tag_* series, per communicator: the "
   "ones that took the most time so far; the others are summed under tag=\"other\"."},
  {"WEFT_TAG_NAMES", Kind::kString, "", 0, 0, nullptr,
   "Names for user tags (NCCL 2.32+: userProfilerTag of the ncclCollConfig_t given to ncclAllReduceConfig and the "
   "other *Config calls), NUMBER=NAME comma-separated (1=forward,2=backward,"
   "0x10=optimizer): the records' tag_name and the Prometheus tag label. Unnamed tags are shown as numbers; entries "
   "that do not parse are named in a warning and ignored."},
  {"WEFT_TUNER", Kind::kBool, "1", 0, 0, nullptr,
   "The tuner (NCCL 2.21+ finds it in this library when NCCL_TUNER_PLUGIN is unset): 0 = a pass-through that "
   "leaves every NCCL choice as it is."},
  {"WEFT_TUNER_PROFILE", Kind::kString, "", 0, 0, nullptr,
   "Tuner profile (weft's JSON, or NCCL's example CSV rules) loaded at communicator init. Every rank must load the "
   "same file. Empty: no profile (pass-through unless exploring or forcing)."},
  {"WEFT_TUNER_EXPLORE", Kind::kBool, "0", 0, 0, nullptr,
   "Opt-in exploration: per collective and size, the first calls try NCCL's valid algorithm/protocol pairs within "
   "3x of its best model time, in a fixed order driven by the call count (identical on every rank)."},
  {"WEFT_TUNER_FORCE", Kind::kString, "", 0, 0, nullptr,
   "Sweep mode: ALGO/PROTO[/CHANNELS] (e.g. RING/LL128, TREE/SIMPLE/8) wherever NCCL's table allows it."},
  {"WEFT_TUNER_MARGIN", Kind::kInt, "3", 0, 50, nullptr,
   "Percent a measured winner must beat NCCL's own pick by (and by two standard errors) before the tuner changes it."},
  {"WEFT_TUNER_CHECK", Kind::kBool, "1", 0, 0, nullptr,
   "Refuse a connection whose peer's tuner would decide differently (other WEFT_TUNER* settings, another or a "
   "missing profile): NCCL's init fails naming both instead of hanging. 0 where NCCL does not use this library's "
   "tuner (before 2.21 without NCCL_TUNER_PLUGIN=weft)."},
  {"WEFT_TUNER_LOG", Kind::kBool, "0", 0, 0, nullptr,
   "Log the tuner's decision for the first call of each collective and size bucket (NCCL_DEBUG=INFO, "
   "NCCL_DEBUG_SUBSYS=TUNING)."},
  {"WEFT_TUNER_RECORD", Kind::kString, "", 0, 0, nullptr,
   "At communicator finalize, write which algorithm/protocol pairs NCCL offered per collective (the profile "
   "signature) to this file; weft tune sweep uses it."},
};
// clang-format on

// Chosen when each weft comm opened its own rxm endpoint, and re-measured on shared endpoints (one per context,
// device and NIC; 256 connections to one peer process): 36 MiB per endpoint without a shared receive context,
// 87 MiB with it, bandwidth equal or better without. Without it rxm posts 128 buffers (~2 MiB) per peer
// process, so past ~25 peers per endpoint (all-to-all at scale) a user does better with FI_OFI_RXM_USE_SRX=1
// (docs/design.md says so). Over tcp libfabric 1.17's rxm turns on a shared receive
// context by default, which posts 4,096 receive buffers of ~17.4 KiB at fi_enable and zero-fills them
// (prov/rxm/src/rxm_init.c rxm_use_srx, rxm_ep.c, util_buf.c): 85 MiB and 0.43 s a comm. Without it: 34.5 MiB and
// 57 ms (rxm still allocates 2 x 1,024 bounce buffers of FI_OFI_RXM_BUFFER_SIZE per endpoint), latency and
// bandwidth from 8 B to 64 MiB within noise. Smaller buffers were measured and left alone: the eager limit follows
// the buffer size (4 KiB: 8 KiB messages 3x slower, 1 MiB streams 0.6x), and an eager limit set above it
// (FI_OFI_RXM_EAGER_LIMIT, unexpected messages then go to malloc'd buffers) hung a bench run with the machine
// loaded in 7 of 10 tries, never with the default buffer.
// clang-format off
const std::vector<ForeignDefault> kForeignDefaults = {
  {"FI_OFI_RXM_USE_SRX", "0",
   "rxm: no shared receive context per endpoint (over tcp, with one peer: 87 MiB an endpoint with it, 36 MiB "
   "without; set 1 for all-to-all over ~25 peer processes and more; verbs has it off already)"},
  {"RDMAV_FORK_SAFE", "1",
   "rdma-core: fork() (PyTorch DataLoader workers) must not corrupt registered memory by copy-on-write; NCCL's "
   "own IB transport does the same with ibv_fork_init"},
  {"FI_EFA_FORK_SAFE", "1", "efa: the same fork safety for the EFA provider"},
  {"FI_AV_REMOVE_CLEANUP", "1",
   "rxm: removing a peer's address closes its connection (weft removes none otherwise): rail failover with the "
   "rdma protocol resets a failed rail's connection this way, so that nothing it held can land later"},
  {"FI_SOCKETS_MAX_BUF_SZ", "4194304",
   "sockets: fixed socket buffers (the kernel doubles it, up to net.core.rmem_max) instead of autotuned ones: the "
   "provider peeks each message header, and a partly arrived header left in a fat loopback skb could fill an "
   "autotuned receive buffer (~230 KB) and shut the window for good (data.max_requests stalled 7 runs in 400 "
   "without it, 0 in 1,600 with it)"},
};
// clang-format on

std::mutex gMutex;  // guards gValues during load/reload (values are read-only afterwards)
std::vector<Value> gValues;
bool gLoaded = false;
// Set once the values are loaded: readers after that take no lock (so that a fork while another thread reads a
// value cannot leave the child's lock held; reads come from connection set-up too, numa::allocate).
std::atomic<bool> gReady{false};

bool parseChoice(std::string_view text, const char* choices, std::string* error) {
  std::string_view rest(choices);
  while (!rest.empty()) {
    size_t bar = rest.find('|');
    if (rest.substr(0, bar) == text) return true;
    if (bar == std::string_view::npos) break;
    rest.remove_prefix(bar + 1);
  }
  *error = "'" + std::string(text) + "' is not one of " + choices;
  return false;
}

Value parseOne(const Def& def) {
  Value v{&def, def.defaultValue, false, true, {}, 0, {}};
  if (const char* env = std::getenv(def.name)) {
    v.raw = env;
    v.fromEnv = true;
  }
  auto apply = [&](const std::string& text) -> bool {
    switch (def.kind) {
      case Kind::kString: v.s = text; return true;
      case Kind::kInt: return parseInt(text, def.min, def.max, &v.i, &v.error);
      case Kind::kBool: {
        bool b = false;
        if (!parseBool(text, &b, &v.error)) return false;
        v.i = b ? 1 : 0;
        return true;
      }
      case Kind::kChoice: v.s = text; return parseChoice(text, def.choices, &v.error);
    }
    return false;
  };
  if (!apply(v.raw)) {
    v.valid = false;
    std::string err = v.error;
    apply(def.defaultValue);  // the default stays in effect
    v.error = err;
  }
  return v;
}

void loadLocked() {
  gValues.clear();
  for (const auto& d : kDefs) gValues.push_back(parseOne(d));
  gLoaded = true;
}

const Value& find(std::string_view name) {
  for (const auto& v : values()) {
    if (name == v.def->name) return v;
  }
  throw Error(Status::kInternal, "undeclared parameter " + std::string(name));
}

}  // namespace

const std::vector<Def>& definitions() { return kDefs; }

const std::vector<Value>& values() {
  if (gReady.load(std::memory_order_acquire)) return gValues;
  std::lock_guard<std::mutex> lock(gMutex);
  if (!gLoaded) loadLocked();
  gReady.store(true, std::memory_order_release);
  return gValues;
}

void reload() {
  std::lock_guard<std::mutex> lock(gMutex);
  loadLocked();
}

int64_t getInt(std::string_view name) { return find(name).i; }
bool getBool(std::string_view name) { return find(name).i != 0; }
const std::string& getString(std::string_view name) { return find(name).s; }

namespace {
// What weft's own scripts and test programs read, not the plugin (a user may have any of them set when NCCL loads
// it): the libfabric 2.x build's cache (scripts/libfabric2.sh), the package install check, the end-to-end and
// GPU-lease scripts, the test programs. Not a typo of a plugin variable, so not a problem.
bool readByScripts(std::string_view name) {
  constexpr std::string_view kPrefixes[] = {"WEFT_TEST_", "WEFT_E2E_", "WEFT_LEASE_"};
  constexpr std::string_view kNames[] = {"WEFT_CACHE_DIR", "WEFT_INSTALL_CHECK", "WEFT_LIBFABRIC2_CUDA",
                                         "WEFT_KEEP_TELEMETRY", "WEFT_TUNER_TEST_MODE"};
  for (std::string_view p : kPrefixes) {
    if (name.substr(0, p.size()) == p) return true;
  }
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
}  // namespace

std::vector<std::string> problems() {
  std::vector<std::string> out;
  for (const auto& v : values()) {
    if (!v.valid) {
      out.push_back(std::string(v.def->name) + "='" + v.raw + "': " + v.error + " (using the default '" +
                    v.def->defaultValue + "')");
    }
  }
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.rfind("WEFT_", 0) != 0) continue;
    std::string_view name = kv.substr(0, kv.find('='));
    bool known = std::any_of(kDefs.begin(), kDefs.end(), [&](const Def& d) { return name == d.name; });
    if (!known && !readByScripts(name)) {
      out.push_back(std::string(name) + " is not a weft variable (see `weft info` for the list)");
    }
  }
  return out;
}

bool parseInt(std::string_view text, int64_t min, int64_t max, int64_t* out, std::string* error) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    *error = "'" + std::string(text) + "' is not an integer";
    return false;
  }
  if (value < min || value > max) {
    *error = std::to_string(value) + " is outside [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    return false;
  }
  *out = value;
  return true;
}

std::vector<std::string> splitFields(std::string_view text, char sep) {
  std::vector<std::string> out;
  for (size_t a = 0;;) {
    size_t b = text.find(sep, a);
    out.emplace_back(text.substr(a, b == std::string_view::npos ? std::string_view::npos : b - a));
    if (b == std::string_view::npos) return out;
    a = b + 1;
  }
}

bool parseBool(std::string_view text, bool* out, std::string* error) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "1" || t == "true" || t == "yes" || t == "on") {
    *out = true;
    return true;
  }
  if (t == "0" || t == "false" || t == "no" || t == "off") {
    *out = false;
    return true;
  }
  *error = "'" + std::string(text) + "' is not a boolean (1/0, true/false, yes/no, on/off)";
  return false;
}

const std::vector<ForeignDefault>& foreignDefaults() { return kForeignDefaults; }

const std::vector<ForeignSetting>& applyForeignDefaults() {
  static const std::vector<ForeignSetting> applied = applyForeignDefaultsNow();
  return applied;
}

std::vector<ForeignSetting> applyForeignDefaultsNow() {
  std::vector<ForeignSetting> out;
  for (const auto& d : kForeignDefaults) {
    const char* user = std::getenv(d.name);
    if (user != nullptr) {
      out.push_back(ForeignSetting{&d, user, true});
    } else {
      setenv(d.name, d.value, 0);
      out.push_back(ForeignSetting{&d, d.value, false});
    }
  }
  return out;
}

const char* foreign(const char* name) { return std::getenv(name); }

}  // namespace weft::params

# SPDX-License-Identifier: Apache-2.0
# The net table over loopback: the weft plugin file driven through its C tables by two processes, per table version,
# provider and option; dead and unreachable peers; the harness itself. Why an entry leaves a check out (--skip):
# docs/testing.md, "Checks left out, and why".

# Every table version over tcp;ofi_rxm (v11, what NCCL 2.28 picks, runs the long checks too) and shm (the oldest and
# v11 in every run; the rest in the long run, WEFT_TEST_LONG=1).
foreach(v 7 8 9 10 11 12)
  set(_quick --quick)
  if(v EQUAL 11)
    set(_quick)
  endif()
  weft_conformance(NAME conformance.fabric-tcp.v${v} OVER fabric-tcp ARGS --table ${v} ${_quick})
  set(_long)
  if(NOT v EQUAL 7 AND NOT v EQUAL 11)
    set(_long LABELS conformance long)
  endif()
  weft_conformance(NAME conformance.shm.v${v} OVER shm ${_long} ARGS --table ${v} --quick
                   --skip data.send_larger_than_recv --skip weft.send_larger_than_recv --skip data.grouped_skew)
endforeach()
weft_conformance(NAME conformance.sockets.v11 OVER sockets ARGS --quick --skip hygiene.connect_cycles)

# The rdma protocol (auto picks it on hardware providers only, so it is forced here): buffer offers, RMA writes with
# remote completion data, eager tagged sends below WEFT_EAGER_MAX (and 0: every message by RMA, 0 bytes included).
weft_conformance(NAME conformance.fabric-tcp.rdma.v11 OVER fabric-tcp ARGS --table 11 --quick --env WEFT_PROTOCOL=rdma)
weft_conformance(NAME conformance.fabric-tcp.rdma.v11.full OVER fabric-tcp LABELS conformance long
                 ARGS --table 11 --env WEFT_PROTOCOL=rdma)
foreach(v 7 9 12)
  weft_conformance(NAME conformance.fabric-tcp.rdma.v${v} OVER fabric-tcp
                   ARGS --table ${v} --quick --env WEFT_PROTOCOL=rdma)
endforeach()
weft_conformance(NAME conformance.fabric-tcp.rdma_no_eager.v11 OVER fabric-tcp
                 ARGS --table 11 --quick --env WEFT_PROTOCOL=rdma --env WEFT_EAGER_MAX=0)
weft_conformance(NAME conformance.sockets.rdma.v11 OVER sockets
                 ARGS --quick --env WEFT_PROTOCOL=rdma --skip hygiene.connect_cycles)
weft_conformance(NAME conformance.shm.rdma.v11 OVER shm
                 ARGS --quick --env WEFT_PROTOCOL=rdma --skip data.send_larger_than_recv --skip weft.send_larger_than_recv)

# shm between workers in PID namespaces of their own (as two containers sharing /dev/shm): both are process 1, and
# libfabric's default endpoint names (process id and a counter) collided: -FI_EBUSY at fi_enable. weft names them.
weft_conformance(NAME conformance.shm.pid_ns OVER shm
                 ARGS --table 11 --quick --pid-ns --only connect --only data.sizes --only teardown --only soak)

# Shared endpoints are the default (WEFT_FABRIC_SHARED_EP=1). 2,048 connections held at once between two processes,
# in both protocols: each worker must hold one libfabric endpoint open. The 4-byte completion data without the comm
# id cannot share an endpoint: a shared group carries those connections with sendrecv.
weft_conformance(NAME conformance.fabric-tcp.scale OVER fabric-tcp LOCKS cpu
                 ARGS --only comms.scale --conns 2048 --max-endpoints 1)
weft_conformance(NAME conformance.fabric-tcp.rdma.scale OVER fabric-tcp LOCKS cpu
                 ARGS --only comms.scale --conns 2048 --max-endpoints 1 --env WEFT_PROTOCOL=rdma)
weft_conformance(NAME conformance.fabric-tcp.rdma_cq4.scale OVER fabric-tcp
                 ARGS --only comms.scale --conns 64 --max-endpoints 1 --env WEFT_PROTOCOL=rdma --env WEFT_CQ_DATA=4)

# An endpoint per connection (WEFT_FABRIC_SHARED_EP=0, kept for rdma on 4-byte completion data): a table with
# per-init contexts (v11) and one without (v9), both protocols; comms.scale holds 16 connections there (an rxm
# endpoint per connection is ~35 MiB; sockets stops at 128 endpoints).
set(_private --quick --conns 16 --env WEFT_FABRIC_SHARED_EP=0)
weft_conformance(NAME conformance.fabric-tcp.private.v11 OVER fabric-tcp ARGS --table 11 ${_private})
weft_conformance(NAME conformance.fabric-tcp.private.v9 OVER fabric-tcp ARGS --table 9 ${_private})
weft_conformance(NAME conformance.fabric-tcp.private.rdma.v11 OVER fabric-tcp
                 ARGS --table 11 ${_private} --env WEFT_PROTOCOL=rdma)
weft_conformance(NAME conformance.shm.private.rdma_cq4.v11 OVER shm
                 ARGS --table 11 ${_private} --env WEFT_PROTOCOL=rdma --env WEFT_CQ_DATA=4
                      --skip data.send_larger_than_recv --skip weft.send_larger_than_recv)
weft_conformance(NAME conformance.sockets.private.rdma.v11 OVER sockets
                 ARGS --table 11 ${_private} --env WEFT_PROTOCOL=rdma --skip hygiene.connect_cycles)

# The compact 4-byte completion data EFA and verbs carry (forced with WEFT_CQ_DATA=4), every message by RMA: lengths
# as pieces over tcp;ofi_rxm (which reports no write lengths; an endpoint per connection), the comm id over shm.
weft_conformance(NAME conformance.fabric-tcp.rdma_cq4.v11 OVER fabric-tcp
                 ARGS --table 11 ${_private} --env WEFT_PROTOCOL=rdma --env WEFT_CQ_DATA=4 --env WEFT_EAGER_MAX=0)
weft_conformance(NAME conformance.shm.rdma_cq4.v11 OVER shm
                 ARGS --table 11 --quick --env WEFT_PROTOCOL=rdma --env WEFT_CQ_DATA=4 --env WEFT_EAGER_MAX=0
                      --skip data.send_larger_than_recv --skip weft.send_larger_than_recv)

# The read-back flush (an RMA read of the received buffer after GPU receives), on host buffers standing in for GPU
# ones (WEFT_FLUSH=all): tcp in both protocols, shm; the whole quick set with it on, so flushing changes nothing else.
# (--only weft.flush skipping would leave nothing run: exit 77, which CI fails.)
weft_conformance(NAME conformance.fabric-tcp.flush OVER fabric-tcp ARGS --only weft.flush --env WEFT_FLUSH=all)
weft_conformance(NAME conformance.fabric-tcp.rdma.flush OVER fabric-tcp
                 ARGS --quick --env WEFT_PROTOCOL=rdma --env WEFT_FLUSH=all)
weft_conformance(NAME conformance.shm.flush OVER shm ARGS --only weft.flush --env WEFT_FLUSH=all)

# Delivery acknowledgements (WEFT_DELIVERY_ACK): a send completes only once the receiver took it; the whole quick set
# with them on every connection, weft.delivery_ack checking the property by withholding the receiver.
weft_conformance(NAME conformance.fabric-tcp.acks.v11 OVER fabric-tcp
                 ARGS --table 11 --quick --env WEFT_DELIVERY_ACK=all)
weft_conformance(NAME conformance.fabric-tcp.rdma.acks.v11 OVER fabric-tcp
                 ARGS --table 11 --quick --env WEFT_DELIVERY_ACK=all --env WEFT_PROTOCOL=rdma)

# Net-plugin profiler events (WEFT_TIMING=net): every message opens an event through the callback NCCL hands to v10+
# init, under its step's pHandle, and closes it once; and the data path passes with timing off altogether.
foreach(v 10 12)
  weft_conformance(NAME conformance.fabric-tcp.timing_net.v${v} OVER fabric-tcp
                   ARGS --table ${v} --quick --only data --only profiler --only teardown --env WEFT_TIMING=net)
endforeach()
weft_conformance(NAME conformance.fabric-tcp.timing_off.v11 OVER fabric-tcp
                 ARGS --table 11 --quick --only data --only profiler --env WEFT_TIMING=0)

# weft's own TCP backend (WEFT_BACKEND=tcp): every check on v11 (weft.unreachable_peer with a 3 s connect timeout),
# the quick set on the other tables; options off by default (several flows a connection, busy polling); grouping off
# (maxRecvs 1, as NCCL's Socket transport: the grouped checks skip).
foreach(v 7 9 11 12)
  set(_quick --quick)
  if(v EQUAL 11)
    set(_quick --env WEFT_CONNECT_TIMEOUT=3)
  endif()
  weft_conformance(NAME conformance.tcp.v${v} OVER tcp ARGS --table ${v} ${_quick})
endforeach()
# Several flows a connection (docs/tcp.md): every check at 4 and at 16 flows, pieces small enough that the checks'
# 64 KiB-1 MiB messages travel in pieces over all of them; busy polling on beside.
weft_conformance(NAME conformance.tcp.flows4.v11 OVER tcp
                 ARGS --table 11 --quick --env WEFT_TCP_FLOWS=4 --env WEFT_STRIPE_MIN=16384 --env WEFT_TCP_CHUNK=16384
                      --env WEFT_TCP_BUSY_POLL=50)
weft_conformance(NAME conformance.tcp.flows16.v11 OVER tcp
                 ARGS --table 11 --quick --env WEFT_TCP_FLOWS=16 --env WEFT_STRIPE_MIN=16384 --env WEFT_TCP_CHUNK=8192)
weft_conformance(NAME conformance.tcp.maxrecvs1.v11 OVER tcp ARGS --table 11 --quick --env WEFT_TCP_MAX_RECVS=1)
# Helper threads (WEFT_TCP_THREADS, docs/tcp.md): the quick set at 16 flows with 2 helpers moving flows 1 and up
# (weft.tcp_flows asks them for a quarter of the bytes on each side; every check passed so, 14 s), and the dead-peer
# checks with them at 4 flows.
weft_conformance(NAME conformance.tcp.threads2.flows16.v11 OVER tcp
                 ARGS --table 11 --quick --env WEFT_TCP_FLOWS=16 --env WEFT_STRIPE_MIN=16384 --env WEFT_TCP_CHUNK=8192
                      --env WEFT_TCP_THREADS=2)
# Stall lines (WEFT_STALL_S, docs/hangs.md): a send posted late and a receive posted late each warn once, naming the
# case, and the sender's stall shows in its Prometheus file while it lasts; over one flow and over 4 with helper
# threads.
set(_stall --table 11 --only weft.stall_lines --env WEFT_STALL_S=1 --env WEFT_PROM_FILE=stall.prom
           --env WEFT_PROM_INTERVAL=1)
weft_conformance(NAME conformance.tcp.stall_lines OVER tcp ARGS ${_stall})
weft_conformance(NAME conformance.tcp.threads2.stall_lines OVER tcp
                 ARGS ${_stall} --env WEFT_TCP_FLOWS=4 --env WEFT_TCP_THREADS=2)
# The libfabric backend's stall lines (docs/hangs.md): over tcp;ofi_rxm (tagged sends) and shm (the rdma protocol:
# a send waits for the receiver's offer).
weft_conformance(NAME conformance.fabric-tcp.stall_lines OVER fabric-tcp ARGS ${_stall})
weft_conformance(NAME conformance.shm.rdma.stall_lines OVER shm ARGS ${_stall} --env WEFT_PROTOCOL=rdma)
foreach(check sender_killed receiver_killed killed_many)
  weft_conformance(NAME faults.tcp.threads2.${check} OVER tcp TIMEOUT 300 LABELS faults
                   ARGS --only faults.${check} --timeout 40 --env WEFT_TCP_FLOWS=4 --env WEFT_STRIPE_MIN=16384
                        --env WEFT_TCP_CHUNK=16384 --env WEFT_TCP_THREADS=2)
endforeach()

# GPU memory (--mem cuda, the mock CUDA driver) where the provider has no FI_HMEM (Debian's libfabric): weft does not
# advertise NCCL_PTR_CUDA, and every device check must say so (a skip: the run exits 77) instead of passing.
weft_test(NAME conformance.fabric-tcp.gpu_mock_unsupported LABELS conformance EXIT 77
  COMMAND ${WEFT_BIN} conformance --plugin ${WEFT_SO} --quick --mem cuda --only data.sizes --only weft.flush
          ${WEFT_OVER_fabric-tcp} --env WEFT_GDR=1
  ENV LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}
  EXPECT "0 passed, 0 failed, 2 skipped" REJECT "\\[(PASS|FAIL)\\]")

# Dead peers: one worker SIGKILLs itself with the other's requests outstanding; the survivor's test must fail within
# WEFT_PROBE_INTERVAL + WEFT_PEER_TIMEOUT (shm is absent: a dead process's shared region still accepts writes).
foreach(check sender_killed receiver_killed)
  foreach(over fabric-tcp sockets tcp)
    weft_conformance(NAME faults.${over}.${check} OVER ${over} TIMEOUT 300 LABELS faults
                     ARGS --only faults.${check} --timeout 40)
  endforeach()
  weft_conformance(NAME faults.fabric-tcp.rdma.${check} OVER fabric-tcp TIMEOUT 300 LABELS faults
                   ARGS --only faults.${check} --timeout 40 --env WEFT_PROTOCOL=rdma)
  weft_conformance(NAME faults.fabric-tcp.private.${check} OVER fabric-tcp TIMEOUT 300 LABELS faults
                   ARGS --only faults.${check} --timeout 40 --env WEFT_FABRIC_SHARED_EP=0)
endforeach()
# The sender holds 256 connections to the receiver and is killed: all fail within the bound while the receiver's
# connections to itself keep carrying intact data.
foreach(proto sendrecv rdma)
  weft_conformance(NAME faults.fabric-tcp.killed_many.${proto} OVER fabric-tcp TIMEOUT 300 LABELS faults
                   ARGS --only faults.killed_many --timeout 40 --env WEFT_PROTOCOL=${proto})
  # A flush on a comm whose sender was killed: it ends within the bound before the failure is known, fails after.
  weft_conformance(NAME faults.fabric-tcp.${proto}.flush_peer_killed OVER fabric-tcp TIMEOUT 300 LABELS faults
                   ARGS --only faults.flush_peer_killed --timeout 40 --env WEFT_PROTOCOL=${proto} --env WEFT_FLUSH=all)
endforeach()
weft_conformance(NAME faults.tcp.killed_many OVER tcp TIMEOUT 300 LABELS faults
                 ARGS --only faults.killed_many --timeout 40)
# Unreachable peers: a closed listen and a listener that never answers, with a short connect timeout.
foreach(over fabric-tcp sockets)
  weft_conformance(NAME faults.${over}.unreachable_peer OVER ${over} TIMEOUT 300 LABELS faults
                   ARGS --only weft.unreachable_peer --env WEFT_CONNECT_TIMEOUT=3)
endforeach()

# weft bench end to end (short): plugin and raw libfabric side by side, every message verified.
weft_test(NAME bench.fabric-tcp.smoke TIMEOUT 600 LABELS bench LOCKS cpu
  COMMAND ${WEFT_BIN} bench --plugin ${WEFT_SO} --quick --rounds 1 --patterns lat,bw,conns,steps ${WEFT_OVER_fabric-tcp}
  EXPECT "raw-tagged-1ep" REJECT "weft bench: ")

# NCCL's own Socket transport through the same harness: it must pass every check that is not weft.* (skipped, with
# the reason, where the CUDA toolkit's libnccl.so.2 is not on this machine: setup.sh does not install it).
weft_test(NAME conformance.nccl_socket.v11 TIMEOUT 900 LABELS conformance OPTIONAL
  COMMAND ${PROJECT_SOURCE_DIR}/tests/conformance/nccl_socket.sh ${WEFT_BIN} ${CMAKE_BINARY_DIR}/nccl-builtin)

# Differential: one seeded stream through two plugins, the receivers' observations compared (weft diff): against
# NCCL's own Socket transport, between weft's protocols, providers and backends.
weft_test(NAME harness.diff.nccl_socket TIMEOUT 600 LABELS conformance OPTIONAL
  COMMAND ${PROJECT_SOURCE_DIR}/tests/conformance/diff_nccl_socket.sh ${WEFT_BIN} ${CMAKE_BINARY_DIR}/nccl-builtin
          ${WEFT_SO})
weft_test(NAME harness.diff.nccl_socket.tcp TIMEOUT 600 LABELS conformance OPTIONAL
  COMMAND ${PROJECT_SOURCE_DIR}/tests/conformance/diff_nccl_socket.sh ${WEFT_BIN} ${CMAKE_BINARY_DIR}/nccl-builtin
          ${WEFT_SO} --a-env WEFT_BACKEND=tcp)
weft_test(NAME harness.diff.weft_protocols TIMEOUT 600 LABELS conformance
  COMMAND ${WEFT_BIN} diff --plugin ${WEFT_SO} --plugin ${WEFT_SO} ${WEFT_OVER_fabric-tcp}
          --a-env WEFT_PROTOCOL=sendrecv --b-env WEFT_PROTOCOL=rdma)
weft_test(NAME harness.diff.weft_providers TIMEOUT 600 LABELS conformance
  COMMAND ${WEFT_BIN} diff --plugin ${WEFT_SO} --plugin ${WEFT_SO} --quick --a-env WEFT_PROVIDER=tcp%SEMI%ofi_rxm
          --a-env WEFT_IFACE=lo --b-env WEFT_PROVIDER=shm)
weft_test(NAME harness.diff.tcp_vs_fabric TIMEOUT 600 LABELS conformance
  COMMAND ${WEFT_BIN} diff --plugin ${WEFT_SO} --plugin ${WEFT_SO} --quick --env WEFT_IFACE=lo
          --a-env WEFT_BACKEND=tcp --b-env WEFT_PROVIDER=tcp%SEMI%ofi_rxm --b-env WEFT_BACKEND=fabric)

# The harness itself: what is not a plugin, or lacks what is asked for, is reported clearly (an error, not a crash).
weft_test(NAME harness.rejects_non_library LABELS harness EXIT failure
  COMMAND ${WEFT_BIN} conformance --plugin ${CMAKE_CURRENT_SOURCE_DIR}/abi/README.md
  EXPECT "cannot be loaded as a shared library")
weft_test(NAME harness.rejects_library_without_tables LABELS harness EXIT failure
  COMMAND ${WEFT_BIN} conformance --plugin libfabric.so.1
  EXPECT "is not an NCCL net plugin: it exports none of ncclNetPlugin_v6")
weft_test(NAME harness.rejects_missing_table LABELS harness EXIT failure
  COMMAND ${WEFT_BIN} conformance --plugin ${WEFT_SO} --table 6
  EXPECT "does not export ncclNetPlugin_v6")
weft_test(NAME harness.rejects_fuse_without_makevdevice LABELS harness EXIT failure
  COMMAND ${WEFT_BIN} conformance --plugin ${WEFT_SO} --table 8 --quick --only init --fuse 0 ${WEFT_OVER_fabric-tcp}
  EXPECT "has no makeVDevice")
# A worker that crashes leaves its core dump under the build tree, never in the directory the run started from.
weft_test(NAME harness.worker_crash_dump TIMEOUT 120 LABELS harness PROVOKES_FAILURES
  COMMAND ${PROJECT_SOURCE_DIR}/tests/conformance/crash_dump_test.sh ${WEFT_BIN} $<TARGET_FILE:weft_crash_plugin>
          ${CMAKE_BINARY_DIR}/dumps/crash-test)
# A failing check ends its pair of workers and the checks after it run in a fresh pair. Debian's shm (1.17) never
# ends a receive whose buffer is smaller than a segmented message: that check fails, and the two after it must pass.
if(LIBFABRIC_VERSION VERSION_LESS 1.18)
  weft_test(NAME harness.isolates_failing_check LABELS harness EXIT 1
    COMMAND ${WEFT_BIN} conformance --plugin ${WEFT_SO} --table 11 --timeout 20 --only data.send_larger_than_recv
            --only threads.service_and_progress --only comms.many ${WEFT_OVER_shm}
    EXPECT "2 pairs of workers.*\\[FAIL\\] data.send_larger_than_recv.*conformance: 2 passed, 1 failed")
endif()
# NCCL 2.30's rail hints: a NIC's rail and plane reach the v12 properties (weft info reads them through the table).
weft_test(NAME info.nic_rails TIMEOUT 60 LABELS harness
  COMMAND ${WEFT_BIN} info --plugin ${WEFT_SO}
  ENV WEFT_PROVIDER=tcp%SEMI%ofi_rxm WEFT_IFACE=lo WEFT_NIC_RAILS=lo:3:1
  EXPECT "dev 0: lo .* rail 3 plane 1")

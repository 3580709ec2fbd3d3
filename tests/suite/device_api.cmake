# SPDX-License-Identifier: Apache-2.0
# NCCL's device API through its proxy: weft conformance --rma drives the plugin file's GIN/RMA table with ranks as
# processes, as NCCL's proxy does. Every exported table version over weft's sockets; the same over libfabric 1.17
# (2.x: libfabric2.cmake; verbs and NCCL's own GIN proxy: guests.cmake).

# Every exported table version, 3 ranks (so that a rank's peers differ), the million-operation soak's short form.
foreach(sym ncclGinPlugin_v11 ncclGinPlugin_v12 ncclGinPlugin_v13 ncclRmaPlugin_v13 ncclRmaPlugin_v14
            ncclRmaPlugin_v15 ncclRmaPlugin_v16 ncclRmaPlugin_v17)
  weft_rma(NAME rma.conformance.${sym} OVER tcp ARGS --symbol ${sym} --ranks 3 --soak 100000 --timeout 240)
endforeach()
# GPU windows under the mock CUDA driver (device memory the CPU cannot touch); 8 ranks.
weft_rma(NAME rma.conformance.gpu_mock OVER tcp ENV LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}
         ARGS --ranks 3 --mem cuda --soak 100000 --timeout 240)
weft_rma(NAME rma.conformance.ranks8 OVER tcp TIMEOUT 450 LOCKS cpu ARGS --ranks 8 --timeout 400)

# Data flows (WEFT_TCP_RMA_FLOWS, docs/device-api.md): every check with large puts in pieces over 4 and 16 data
# flows beside the control flow, host and GPU windows; weft.rma_flows checks by the kernel's byte counts that the
# payload travelled on several data flows and not the control flow.
weft_rma(NAME rma.conformance.flows4 OVER tcp ENV WEFT_TCP_RMA_FLOWS=4
         ARGS --ranks 3 --soak 100000 --timeout 240 EXPECT "PASS weft.rma_flows" "PASS signal.after_put")
weft_rma(NAME rma.conformance.flows16.gpu_mock OVER tcp ENV WEFT_TCP_RMA_FLOWS=16 LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}
         ARGS --ranks 2 --mem cuda --soak 20000 --timeout 240 EXPECT "PASS weft.rma_flows" "PASS signal.after_put")

# libfabric 1.17: tcp;ofi_rxm on every table shape NCCL's versions use (GIN v11, RMA v13, v17) and with 8 ranks; shm.
foreach(sym ncclGinPlugin_v11 ncclRmaPlugin_v13 ncclRmaPlugin_v17)
  weft_rma(NAME rma.fabric.tcp-rxm.${sym} OVER fabric-tcp-rxm ARGS --symbol ${sym} --ranks 3 --soak 100000 --timeout 240)
endforeach()
weft_rma(NAME rma.fabric.tcp-rxm.ranks8 OVER fabric-tcp-rxm TIMEOUT 450 LOCKS cpu ARGS --ranks 8 --timeout 400)
weft_rma(NAME rma.fabric.shm OVER fabric-shm ARGS --ranks 3 --soak 100000 --timeout 240)
# GPU windows where the provider has no FI_HMEM: weft does not say it reaches GPU memory, and every check that needs
# it says so (a skip) instead of passing; set-up and teardown still pass.
weft_test(NAME rma.fabric.tcp-rxm.gpu_unsupported TIMEOUT 180 LABELS device-api
  ENV ${WEFT_RMA_fabric-tcp-rxm} LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR} WEFT_GDR=1
  COMMAND ${WEFT_BIN} conformance --rma --plugin ${WEFT_SO} --ranks 2 --mem cuda --timeout 120
  EXPECT "SKIP put" REJECT "PASS (put|get|signal|soak)")
# WEFT_RMA=auto there, with a GPU: the device API goes over weft's TCP sockets, which reach GPU memory.
weft_test(NAME rma.fabric.tcp-rxm.auto_gpu TIMEOUT 180 LABELS device-api
  ENV WEFT_BACKEND=fabric WEFT_PROVIDER=tcp%SEMI%ofi_rxm WEFT_IFACE=lo WEFT_GDR=1 NCCL_DEBUG=INFO
      LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}
  COMMAND ${WEFT_BIN} conformance --rma --plugin ${WEFT_SO} --ranks 2 --mem cuda --soak 20000 --timeout 120 --verbose
  EXPECT "does not reach GPU memory .no FI_HMEM.. the device API goes over weft's TCP sockets" "PASS put")
# With WEFT_RMA=off (or auto beside a net backend that is not tcp) weft reports no RMA device: NCCL looks elsewhere.
weft_test(NAME rma.conformance.off TIMEOUT 120 LABELS device-api EXIT failure
  ENV WEFT_BACKEND=tcp WEFT_RMA=off WEFT_IFACE=lo
  COMMAND ${WEFT_BIN} conformance --rma --plugin ${WEFT_SO} --ranks 2 --timeout 60
  EXPECT "FAIL setup.connect +rank 0: the plugin reports 0 devices")

# Scale: one comm of 64 ranks, 16 a process as threads, over libfabric and over weft's sockets: set-up completes and
# every rank's first put+signal lands (docs/device-api.md has the figures at 1,024).
foreach(over tcp fabric-tcp-rxm)
  set(_n tcp)
  if(over STREQUAL fabric-tcp-rxm)
    set(_n fabric)
  endif()
  weft_test(NAME rma.scale.${_n} TIMEOUT 300 LABELS device-api LOCKS cpu ENV ${WEFT_RMA_${over}}
    COMMAND ${WEFT_BIN} bench --rma --plugin ${WEFT_SO} --ranks 64 --procs 4
    EXPECT "rma-scale ranks=64 procs=4 connect_ms=")
endforeach()

# Between two network namespaces (a veth: a NIC weft does not know) the pairs take 4 data flows with no setting, and
# the payload travels on them (weft.rma_flows); the link-down entries below run with them too.
weft_rma(NAME rma.netns.flows.tcp OVER tcp NETNS TIMEOUT 200 LABELS device-api LOCKS cpu
         ARGS --ranks 2 --only setup --only put.sizes --only signal.after_put --only weft.rma_flows --only teardown
              --timeout 150
         EXPECT "PASS weft.rma_flows" "PASS signal.after_put")

# The link between two network namespaces goes down under the device API (tests/conformance/rma_netns.sh: even ranks
# in one, odd in the other): every rank's requests across it fail within WEFT_PEER_TIMEOUT (3 s), queryLastError
# says so, nothing hangs, and the comm tears down once the link is back. Over sockets and libfabric 1.17.
set(WEFT_RMA_LINKDOWN --ranks 4 --only setup --only put.sizes --only faults.link_down --only teardown --timeout 150)
foreach(over tcp fabric-tcp-rxm)
  weft_rma(NAME rma.netns.link_down.${over} OVER ${over} NETNS TIMEOUT 200 LABELS device-api faults LOCKS cpu
           ARGS ${WEFT_RMA_LINKDOWN} EXPECT "PASS faults.link_down")
endforeach()

# A rank that crashes inside connect while the others wait on it there (as NCCL's IB connect waits on a peer that is
# gone): the run ends within the crash grace (10 s), not --timeout (300 s, beyond this entry's own limit), and says
# which rank crashed and which hung after it.
weft_test(NAME harness.rma_rank_crash TIMEOUT 120 LABELS harness device-api PROVOKES_FAILURES EXIT failure
  COMMAND ${WEFT_BIN} conformance --rma --plugin $<TARGET_FILE:weft_crash_plugin> --symbol ncclGinPlugin_v11 --ranks 3
          --timeout 300
  EXPECT "FAIL setup.connect +rank 0 ended here .exit 134.. rank 1 hung here after rank 0 crashed .signal 6.. rank 2 hung"
         "rank 0 worker .pid [0-9]+.: SIGABRT")

# Stall lines (docs/hangs.md): rank 1 holds off for 3.5 s while 64 MiB of rank 0's puts wait on it (weft.stall_line,
# WEFT_STALL_S=1): rank 0's line names rank 1 and what holds the bytes, and every byte then lands. Over weft's sockets
# the kernel tells the case (rank 1's receive window closed: its proxy reads nothing); over libfabric tcp;ofi_rxm the
# provider needs the target's progress, and the line says what the comm knows.
weft_rma(NAME rma.stall_line.tcp OVER tcp ENV WEFT_STALL_S=1 ARGS --ranks 2 --only weft.stall_line --timeout 120
         EXPECT "RMA .rank 0 of 2.: stalled on rank 1 .+ its receive window is closed.+ .peer_behind."
                "PASS weft.stall_line")
weft_rma(NAME rma.stall_line.tcp.flows4 OVER tcp ENV WEFT_STALL_S=1 WEFT_TCP_RMA_FLOWS=4
         ARGS --ranks 2 --only weft.stall_line --timeout 120
         EXPECT "RMA .rank 0 of 2.: stalled on rank 1 .+ pieces wait to leave on its 4 data flows.+ its receive window "
                "is closed.+ .peer_behind." "PASS weft.stall_line")
weft_rma(NAME rma.stall_line.fabric-tcp-rxm OVER fabric-tcp-rxm ENV WEFT_STALL_S=1
         ARGS --ranks 2 --only weft.stall_line --timeout 120
         EXPECT "RMA .rank 0 of 2.: stalled on rank 1: [0-9]+ operations? of ours ha(s|ve) had no completion"
                "PASS weft.stall_line")

# When a job hangs (docs/hangs.md), the device API's scenarios over weft's sockets (and libfabric's tcp;ofi_rxm for
# the first two), each with WEFT_TELEMETRY_DIR:
# behind (weft.rma_hang_report: rank 1 stops progressing while 64 MiB of rank 0's puts wait; the report over rank
# 0's stall dump and rank 1's live ledger names rank 1's pid), dead (faults.dead_rank: the survivors' dumps name rank
# 2 as lost, from its peers alone) and link (faults.link_down between two namespaces: every cross pair's link named,
# both ends' pids). A cycle has no network side in the device API (kernels waiting on each other's signals leave no
# operation in flight), so there is none.
set(_rma_rec ${CMAKE_BINARY_DIR}/report-hangs-rma)
foreach(over tcp fabric-tcp-rxm)
  weft_test(NAME report.hangs.rma_behind.${over} TIMEOUT 150 LABELS device-api profiler
    ENV ${WEFT_RMA_${over}} WEFT_STALL_S=1 WEFT_TELEMETRY_DIR=${_rma_rec}-behind-${over}
        WEFT_PROM_FILE=${_rma_rec}-behind-${over}/weft-%p.prom WEFT_PROM_INTERVAL=1
    COMMAND sh -c "rm -rf '${_rma_rec}-behind-${over}' && '${WEFT_BIN}' conformance --rma --plugin '${WEFT_SO}' --ranks 2 --only setup --only weft.rma_hang_report --only teardown --timeout 120 --verbose"
    EXPECT "rank 0: weft report --hangs: every chain of waits ends at rank 1 of 2 .device API. .[^ ]+ pid [0-9]+.: it is behind"
           "PASS weft.rma_hang_report")
  # Over libfabric the ends have no addresses in the ledger: the dead peer is named by its rank alone.
  weft_test(NAME report.hangs.rma_dead.${over} TIMEOUT 150 LABELS device-api profiler faults
    ENV ${WEFT_RMA_${over}} WEFT_TELEMETRY_DIR=${_rma_rec}-dead-${over}
    COMMAND sh -c "rm -rf '${_rma_rec}-dead-${over}' && '${WEFT_BIN}' conformance --rma --plugin '${WEFT_SO}' --ranks 3 --only setup --only faults.dead_rank --only teardown --timeout 120 >/dev/null && '${WEFT_BIN}' report --hangs '${_rma_rec}-dead-${over}'"
    EXPECT "weft report --hangs: a rank died or was lost: rank 2 of 3 .device API., (a process at 127.0.0.1 .)?no dump from it"
           "--rma on lo, peer_gone")
endforeach()
weft_test(NAME report.hangs.rma_link.tcp TIMEOUT 250 LABELS device-api profiler faults netns LOCKS cpu
  ENV WEFT_BACKEND=tcp WEFT_RMA=on WEFT_STALL_S=1 WEFT_TELEMETRY_DIR=${_rma_rec}-link
  COMMAND sh -c "rm -rf '${_rma_rec}-link' && '${PROJECT_SOURCE_DIR}/tests/conformance/rma_netns.sh' '${WEFT_BIN}' '${WEFT_SO}' --ranks 4 --only setup --only faults.link_down --only teardown --timeout 150 >/dev/null && '${WEFT_BIN}' report --hangs '${_rma_rec}-link'"
  EXPECT "weft report --hangs: bytes stopped on the way .the link, or a host on it.: rank 0 of 4 .device API. .[^ ]+ pid [0-9]+. <-> rank 1 of 4 .device API. .[^ ]+ pid [0-9]+. .NIC "
         "--rma on [^ ]+, (link|peer_gone),")

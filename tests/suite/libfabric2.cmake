# SPDX-License-Identifier: Apache-2.0
# The libfabric entries again on libfabric 2.x (LF2: name suffix .lf2, label libfabric2; declared only where
# scripts/libfabric2.sh built it, which CI must), plus 2.x's own reliable-datagram tcp endpoint (fabric-tcp-rdm),
# which 1.17 lacks. Why an entry leaves a check out or holds fewer connections: docs/testing.md.
if(NOT WEFT_LF2_LIB)
  return()
endif()

# The library loaded with that environment is 2.x: weft info says so (the fabric-tcp-rdm entries cannot pass on
# 1.17, whose tcp provider has no reliable-datagram endpoint).
weft_test(NAME info.libfabric2 TIMEOUT 60 LABELS libfabric2 ENV LD_LIBRARY_PATH=${WEFT_LF2_LIB}
          COMMAND ${WEFT_BIN} info EXPECT "libfabric 2\\.[0-9]+ at run time")

# v11 runs the quick set in every run and every check in the long run (.full: the 1 GiB message, 1,024 and 2,048
# connections, the cycles), where the entries that move 1 GiB hold the cpu lock.
set(_full LABELS conformance long LOCKS cpu)
foreach(over fabric-tcp fabric-tcp-rdm)
  weft_conformance(NAME conformance.${over}.v11 OVER ${over} LF2 ARGS --table 11 --quick)
  weft_conformance(NAME conformance.${over}.v11.full OVER ${over} LF2 ${_full} ARGS --table 11)
  weft_conformance(NAME conformance.${over}.v12 OVER ${over} LF2 ARGS --table 12 --quick)
  set(_rdmaConns)
  set(_rdmaQuickConns)
  if(over STREQUAL "fabric-tcp-rdm")
    set(_rdmaConns --conns 256)  # 2.1's own endpoint resets its connection at 1,024 (docs/testing.md)
    set(_rdmaQuickConns --conns 64)  # and once at 256 beside other entries
  endif()
  weft_conformance(NAME conformance.${over}.rdma.v11 OVER ${over} LF2
                   ARGS --table 11 --quick --env WEFT_PROTOCOL=rdma ${_rdmaQuickConns})
  weft_conformance(NAME conformance.${over}.rdma.v11.full OVER ${over} LF2 ${_full}
                   ARGS --table 11 --env WEFT_PROTOCOL=rdma ${_rdmaConns})
  weft_conformance(NAME conformance.${over}.scale OVER ${over} LF2 LOCKS cpu
                   ARGS --only comms.scale --conns 2048 --max-endpoints 1)
  weft_conformance(NAME conformance.${over}.private.v11 OVER ${over} LF2
                   ARGS --table 11 --quick --conns 16 --env WEFT_FABRIC_SHARED_EP=0)
  foreach(check sender_killed receiver_killed)
    weft_conformance(NAME faults.${over}.${check} OVER ${over} LF2 TIMEOUT 300 ARGS --only faults.${check} --timeout 40)
  endforeach()
endforeach()
# shm 2.1 still leaves a receive shorter than a segmented message unended with the sendrecv protocol; the rdma
# protocol runs everything. 2.1's sockets provider keeps connecting past 128 endpoints: hygiene.connect_cycles runs.
set(_shmSkips --skip data.send_larger_than_recv --skip weft.send_larger_than_recv)
weft_conformance(NAME conformance.shm.v11 OVER shm LF2 ARGS --table 11 --quick ${_shmSkips})
weft_conformance(NAME conformance.shm.v11.full OVER shm LF2 ${_full} ARGS --table 11 ${_shmSkips})
weft_conformance(NAME conformance.shm.rdma.v11 OVER shm LF2 ARGS --table 11 --quick --env WEFT_PROTOCOL=rdma)
weft_conformance(NAME conformance.shm.rdma.v11.full OVER shm LF2 ${_full} ARGS --table 11 --env WEFT_PROTOCOL=rdma)
weft_conformance(NAME conformance.sockets.v11 OVER sockets LF2 ARGS --quick)
weft_conformance(NAME conformance.shm.pid_ns OVER shm LF2
                 ARGS --table 11 --quick --pid-ns --only connect --only data.sizes --only teardown --only soak)
# shm's receive entries grow on 2.x: no receive budget there, and the test that needed one on 1.17 still passes;
# 2.1's shm takes weft's endpoint names, and a killed process's file is swept (tests/unit/shm_names_test.cc).
weft_test(NAME unit.shm LF2 COMMAND $<TARGET_FILE:weft_unit_tests> "[shm]")
# Between namespaces: one NIC, two rails, a link taken down.
weft_conformance(NAME conformance.netns.fabric-tcp.v11 NETNS LF2 ARGS --table 11 --quick)
weft_conformance(NAME conformance.netns.rails.rdma.v12 NETNS --rails explicit LF2
                 ARGS --table 12 --quick --env WEFT_PROTOCOL=rdma --env WEFT_EAGER_MAX=0)
weft_conformance(NAME faults.netns.link_down.sendrecv NETNS --link-down LF2 TIMEOUT 120 LOCKS cpu
                 ARGS --table 11 --only faults.link_down --timeout 30 --env WEFT_PEER_TIMEOUT=3
                      --env WEFT_PROBE_INTERVAL=500)
# GPU memory (FI_HMEM) through 2.1's shm, with the mock CUDA driver and runtime (libfabric copies device memory with
# cudaMemcpy; a CPU access to it faults): every data check over device buffers, the read-back flush too, in both
# protocols (a run where weft did not advertise it skips them all: exit 77). Without a driver, shm built with CUDA
# support still offers FI_HMEM: weft must not advertise it.
foreach(proto sendrecv rdma)
  weft_conformance(NAME conformance.shm.${proto}.gpu_mock OVER shm LF2 TIMEOUT 600
                   ENV LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}:${WEFT_LF2_LIB}
                   ARGS --mem cuda --env WEFT_GDR=1 --env WEFT_PROTOCOL=${proto} REJECT "\\[SKIP\\]")
endforeach()
weft_test(NAME info.shm_no_driver LF2 TIMEOUT 60 ENV WEFT_PROVIDER=shm COMMAND ${WEFT_BIN} info
          EXPECT "0: shm .*ptrSupport 0x1 " REJECT "ptrSupport 0x3")

# The device API's RMA over 2.x: its native tcp, tcp;ofi_rxm and shm; GPU windows through shm's FI_HMEM with the
# mock CUDA driver (device memory the CPU cannot touch: signals are applied through the driver); a link down.
foreach(over fabric-tcp fabric-tcp-rxm fabric-shm)
  string(REPLACE "fabric-" "" _n ${over})
  weft_rma(NAME rma.fabric.${_n} OVER ${over} LF2 LABELS device-api ENV WEFT_IFACE=^docker
           ARGS --ranks 3 --soak 100000 --timeout 240)
endforeach()
weft_rma(NAME rma.fabric.shm.gpu_mock OVER fabric-shm LF2 LABELS device-api
         ENV LD_LIBRARY_PATH=${WEFT_MOCK_CUDA_DIR}:${WEFT_LF2_LIB} WEFT_GDR=1
         ARGS --ranks 3 --mem cuda --soak 100000 --timeout 240)
foreach(over fabric-tcp fabric-tcp-rxm)
  weft_rma(NAME rma.netns.link_down.${over} OVER ${over} NETNS LF2 TIMEOUT 200 LABELS device-api faults LOCKS cpu
           ARGS ${WEFT_RMA_LINKDOWN} EXPECT "PASS faults.link_down")
endforeach()

# SPDX-License-Identifier: Apache-2.0
# Everything beside the transports: the profiler and tuner tables, weft report, the machine's layout, the docs that
# are generated, the Debian package, fuzzing, the GPU scripts' dry runs, and the layering of the build.

# The profiler tables replayed the way NCCL calls them, at every timing level: the [.off] case alone with timing off,
# every other case at every other level (a case run where it cannot check fails, saying so).
foreach(level coll proxy net 0)
  set(_cases "~[off]")
  if(level STREQUAL "0")
    set(_cases "[off]")
  endif()
  weft_test(NAME profiler.replay.${level} LABELS profiler ENV WEFT_TIMING=${level}
            COMMAND $<TARGET_FILE:weft_profiler_tests> ${_cases} --warn NoTests)
endforeach()
# WEFT_TELEMETRY_DIR is created with its parents.
weft_test(NAME timing.telemetry_dir_nested TIMEOUT 120 LABELS profiler
          COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/profiler/telemetry_dir_nested.sh ${WEFT_BIN} ${WEFT_SO})

# weft report: a recorded 4-rank job with a straggler planted at rank 3 (made by `weft replay` through weft's profiler);
# three user tags with rank 2 late only in the backward part of each step (the per-tag section names it, from the
# kernels' sync phases; the job-wide section does not); fresh jobs recorded end to end.
weft_test(NAME report.fixture_straggler LABELS profiler
  COMMAND ${WEFT_BIN} report ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/report-straggler
  EXPECT "STRAGGLER comm 0x000000005eed0000 rank 3 " REJECT "STRAGGLER comm [^ ]* rank [012] ")
weft_test(NAME report.fixture_tags LABELS profiler
  COMMAND ${WEFT_BIN} report ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/report-tags
  EXPECT "STRAGGLER tag backward: comm 0x000000005eed0000 rank 2 \\(vm:[0-9]+\\): the others waited a median 2500.0us for it in 8 collectives"
  REJECT "STRAGGLER tag (forward|pipeline)|STRAGGLER tag backward: comm [^ ]* rank [013] |STRAGGLER comm")
weft_test(NAME report.end_to_end LABELS profiler COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/profiler/report_e2e.sh ${WEFT_BIN})
# The connections' stalls (docs/hangs.md): a run of weft.stall_lines over TCP, recorded; weft report names both
# connections, one stall each, and each process left one stall dump in hangs/.
set(_stallRec ${CMAKE_BINARY_DIR}/report-stalls)
weft_test(NAME report.stalls TIMEOUT 120 LABELS profiler
  COMMAND sh -c "rm -rf '${_stallRec}' && '${WEFT_BIN}' conformance --plugin '${WEFT_SO}' --env WEFT_BACKEND=tcp --env WEFT_IFACE=lo --table 11 --only weft.stall_lines --env WEFT_STALL_S=1 --env 'WEFT_TELEMETRY_DIR=${_stallRec}' >/dev/null && '${WEFT_BIN}' report '${_stallRec}' && echo stall dumps: $(ls '${_stallRec}/hangs' | grep -c json) && cat '${_stallRec}'/hangs/*.json"
  EXPECT "2 of 2 connections reported 2 stalls.*stall dumps: 2"
         "\"dir\":\"send\",\"peer\":\"127.0.0.1:[0-9]+\",\"local\":\"127.0.0.1:[0-9]+\".*\"stalls\":1,\"stalled_s\":[1-9][0-9.]*,\"stall_kind\":\"peer_behind\""
         "\"dir\":\"recv\",\"peer\":\"127.0.0.1:[0-9]+\",\"local\":\"127.0.0.1:[0-9]+\".*\"stalls\":1,\"stalled_s\":[1-9][0-9.]*,\"stall_kind\":\"peer_behind\"")
# weft report --hangs over a fixture set of dumps (tests/fixtures/hangs), one scenario each: the cause it names
# first, and the same in JSON.
set(_hangs ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/hangs)
weft_test(NAME report.hangs.behind LABELS profiler COMMAND ${WEFT_BIN} report --hangs ${_hangs}/behind
  EXPECT "^weft report --hangs: every chain of waits ends at rank 2 of 3 in train .b pid 200.: it is behind"
         "4 dumps from 3 processes; 2 connections wait")
weft_test(NAME report.hangs.link LABELS profiler COMMAND ${WEFT_BIN} report --hangs ${_hangs}/link
  EXPECT "^weft report --hangs: bytes stopped on the way .the link, or a host on it.: rank 0 of 2 in train .a pid 100. <-> rank 1 of 2 in train .b pid 200. .NIC eth1.\n")
weft_test(NAME report.hangs.dead LABELS profiler COMMAND ${WEFT_BIN} report --hangs ${_hangs}/dead
  EXPECT "^weft report --hangs: a rank died or was lost: a process at 10.0.0.2 .no dump from it.[.]")
weft_test(NAME report.hangs.cycle LABELS profiler COMMAND ${WEFT_BIN} report --hangs ${_hangs}/cycle
  EXPECT "^weft report --hangs: a cycle: rank 0 of 2 in train .a pid 100. waits on rank 1 of 2 in train .b pid 200. waits on rank 0")
weft_test(NAME report.hangs.json LABELS profiler
  COMMAND sh -c "'${WEFT_BIN}' report --hangs '${_hangs}/behind' --json && '${WEFT_BIN}' report --hangs '${_hangs}/link' --json && '${WEFT_BIN}' report --hangs '${_hangs}/dead' --json && '${WEFT_BIN}' report --hangs '${_hangs}/cycle' --json"
  EXPECT "^.\"cause\":.\"kind\":\"behind\",\"names\":.\"rank 2 of 3 in train .b pid 200.\"."
         "\"kind\":\"link\",\"names\":.\"rank 0 of 2 in train .a pid 100. <-> rank 1"
         "\"kind\":\"dead\",\"names\":.\"a process at 10.0.0.2 .no dump from it.\"."
         "\"kind\":\"cycle\",\"names\":.\"rank 0 of 2 in train .a pid 100.\",\"rank 1 of 2 in train .b pid 200.\".")
# The live scenarios: report.hangs.live_<scenario>.<over>, each `weft conformance ARGS` over <over> (weft's TCP
# sockets, libfabric tcp;ofi_rxm, shm) with its records in a fresh folder under the build tree (WEFT_TELEMETRY_DIR);
# REPORT: then `weft report --hangs` over them (the other checks run the report themselves). NETNS: between two
# namespaces whose veth goes down mid-stream (tests/conformance/netns_conformance.sh --link-down).
set(_over_tcp "--env WEFT_BACKEND=tcp --env WEFT_IFACE=lo")
set(_over_fabric-tcp "--env 'WEFT_PROVIDER=tcp%SEMI%ofi_rxm' --env WEFT_IFACE=lo")
set(_over_shm "--env WEFT_PROVIDER=shm")
function(weft_live_hang scenario over)
  cmake_parse_arguments(H "REPORT;NETNS" "TIMEOUT" "ARGS;EXPECT;LABELS;LOCKS" ${ARGN})
  set(rec ${CMAKE_BINARY_DIR}/report-hangs-${scenario}-${over})
  set(run "'${WEFT_BIN}' conformance --plugin '${WEFT_SO}' ${_over_${over}}")
  if(H_NETNS)  # the namespaces' veth, not lo: the backend alone
    set(run "'${PROJECT_SOURCE_DIR}/tests/conformance/netns_conformance.sh' --link-down '${WEFT_BIN}' '${WEFT_SO}'")
    if(over STREQUAL "tcp")
      string(APPEND run " --env WEFT_BACKEND=tcp")
    endif()
  endif()
  set(cmd "rm -rf '${rec}' && ${run} --table 11 ${H_ARGS} --env 'WEFT_TELEMETRY_DIR=${rec}'")
  if(H_REPORT)
    string(APPEND cmd " >/dev/null && '${WEFT_BIN}' report --hangs '${rec}'")
  endif()
  set(locks)
  if(H_LOCKS)
    set(locks LOCKS ${H_LOCKS})
  endif()
  weft_test(NAME report.hangs.live_${scenario}.${over} TIMEOUT ${H_TIMEOUT} LABELS profiler ${H_LABELS} ${locks}
    COMMAND sh -c "${cmd}" EXPECT ${H_EXPECT})
endfunction()
# Dead: the receiver process SIGKILLs itself with the sender's requests outstanding (faults.receiver_killed); the
# sender's connection fails for its peer and leaves a dump; the report names the dead peer.
foreach(over tcp fabric-tcp)
  weft_live_hang(dead ${over} REPORT TIMEOUT 200 LABELS faults
    ARGS "--only faults.receiver_killed --timeout 40 --env WEFT_PEER_TIMEOUT=3 --env WEFT_PROBE_INTERVAL=500"
    EXPECT "weft report --hangs: a rank died or was lost: a process at 127.0.0.1 .no dump from it.[.]"
           "--send on [^ ]+, peer_gone")
endforeach()
# Link: the veth between the two workers' namespaces goes down mid-stream (faults.link_down, as
# faults.netns.link_down.*): the stall lines find the bytes stopped, the comms then fail after WEFT_PEER_TIMEOUT,
# and the report names the link between the two processes. Over weft's sockets and libfabric's tcp;ofi_rxm.
foreach(over tcp fabric-tcp)
  weft_live_hang(link ${over} REPORT NETNS TIMEOUT 150 LABELS faults netns LOCKS cpu
    ARGS "--only faults.link_down --timeout 30 --env WEFT_PEER_TIMEOUT=3 --env WEFT_PROBE_INTERVAL=500 --env WEFT_STALL_S=1"
    EXPECT "weft report --hangs: bytes stopped on the way .the link, or a host on it.: .+ pid [0-9]+ <-> .+ pid [0-9]+ .NIC "
           "--send on [^ ]+, link,")
endforeach()
foreach(over tcp fabric-tcp shm)
  # Behind (weft.hang_report): a receiver stuck in its application, then the launcher's SIGTERM; the sender's stall
  # dump and the receiver's SIGTERM dump name the receiver as where the waits end, and the application's own
  # SIGTERM handler still runs.
  weft_live_hang(behind ${over} TIMEOUT 150 LABELS conformance ARGS "--only weft.hang_report --env WEFT_STALL_S=1"
    EXPECT "sender: weft report --hangs: every chain of waits ends at .+ pid [0-9]+: it is behind"
           "conformance: 1 passed, 0 failed, 0 skipped")
  # Cycle (weft.hang_cycle): each rank sends 64 MiB to the other before posting its receive; both stall dumps name
  # the cycle, both processes in it.
  weft_live_hang(cycle ${over} TIMEOUT 150 LABELS conformance ARGS "--only weft.hang_cycle --env WEFT_STALL_S=1"
    EXPECT "sender: weft report --hangs: a cycle: .+ pid [0-9]+ waits on .+ pid [0-9]+ waits on"
           "conformance: 1 passed, 0 failed, 0 skipped")
endforeach()
weft_test(NAME report.hangs.no_dumps LABELS profiler EXIT 1 COMMAND ${WEFT_BIN} report --hangs ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/tuner
  EXPECT "no stall dumps under")
weft_test(NAME report.locality TIMEOUT 120 LABELS profiler topology
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/profiler/report_locality.sh ${WEFT_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/report-tags)

# The tuner tables driven as NCCL's enqueue.cc calls them, per mode of the plugin (no profile, a profile from a
# simulated sweep, a malformed one, WEFT_TUNER=0, exploration, recording), each with the rank-consistency check (the
# getCollInfo cost is a benchmark: bench/tuner_bench.cc); sweep -> profile -> decisions; ranks agreeing end to end.
foreach(mode none profile malformed off explore record)
  set(_cases "[driver]")
  if(mode STREQUAL "record")
    set(_cases "[driver],[record]")
  endif()
  weft_test(NAME tuner.driver.${mode} LABELS tuner ENV WEFT_TUNER_TEST_MODE=${mode}
            COMMAND $<TARGET_FILE:weft_tuner_driver_tests> ${_cases} --warn NoTests)
endforeach()
weft_test(NAME tuner.sweep_end_to_end TIMEOUT 600 LABELS tuner
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tuner/sweep_e2e.sh ${WEFT_BIN} $<TARGET_FILE:nccl-tuner-weft>
          ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/nccl-tests)
weft_test(NAME tuner.agreement_end_to_end TIMEOUT 600 LABELS tuner
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tuner/agreement_e2e.sh ${WEFT_BIN} ${WEFT_SO} $<TARGET_FILE:nccl-tuner-weft>)
weft_test(NAME tuner.agreement_end_to_end.tcp TIMEOUT 600 LABELS tuner
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tuner/agreement_e2e.sh ${WEFT_BIN} ${WEFT_SO} $<TARGET_FILE:nccl-tuner-weft>
          --env WEFT_BACKEND=tcp --env WEFT_IFACE=lo)

# The machine's layout (hwloc): `weft info` maps every fixture; the fixtures are what their generator writes;
# connection records made by two workers whose loopback stands for a fixture's far NIC.
weft_test(NAME topology.info_map TIMEOUT 120 LABELS topology
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/topology/info_map.sh ${WEFT_BIN} ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/topology)
weft_test(NAME topology.fixtures_current TIMEOUT 60 LABELS topology
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/topology/fixtures_current.sh ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/topology)
weft_test(NAME topology.conn_records TIMEOUT 400 LABELS topology profiler
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/topology/conn_records.sh ${WEFT_BIN} ${WEFT_SO} ${WEFT_MOCK_CUDA_DIR}
          ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/topology)

# docs/variables.md is `weft info --markdown`: the variables' reference is generated from the parameter table.
weft_test(NAME docs.variables TIMEOUT 60 LABELS docs
  COMMAND sh -c "'${WEFT_BIN}' info --markdown | diff -u '${PROJECT_SOURCE_DIR}/docs/variables.md' - || { echo 'docs/variables.md differs from the parameter table: run  build/bin/weft info --markdown > docs/variables.md'%SEMI% exit 1%SEMI% }")

# The Debian package: scripts/package.sh packs this build, tests/package/install_check.sh installs it into a clean
# Debian 12 root and checks it there (docs/testing.md).
weft_test(NAME package.install TIMEOUT 2700 LABELS package COMMAND ${PROJECT_SOURCE_DIR}/tests/package/install_check.sh)

# The GPU end-to-end scripts where no GPU is: arguments, the "what is missing" answer, dry runs, and their checks on
# recorded nccl-tests logs and loss files.
weft_test(NAME e2e.scripts TIMEOUT 120 LABELS e2e COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/e2e_scripts_test.sh ${PROJECT_SOURCE_DIR})

# libFuzzer targets (clang, ASan+UBSan: setup.sh does not install clang) from the kept corpus, 5 s each (most of the
# entry's time is building them); longer runs: tests/fuzz/run.sh --seconds N.
weft_test(NAME fuzz.short TIMEOUT 900 LABELS fuzz OPTIONAL WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
          COMMAND ${PROJECT_SOURCE_DIR}/tests/fuzz/run.sh --seconds 5)

# Layering: a backend that includes another backend's header fails to build (each layer's headers are reachable only
# through its own public include folder); the control, including only its own, builds. Both build in build/: alone.
weft_test(NAME layering.backend_cannot_include_another SERIAL LABELS layering EXIT failure
  COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target weft_layering_violation
  EXPECT "fabric/fabric_comm.h: No such file or directory")
weft_test(NAME layering.backend_includes_its_own SERIAL LABELS layering
  COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target weft_layering_control)
# The plugin's table files see the engine and the RMA core, never a backend: the engine alone chooses them.
weft_test(NAME layering.plugin_table_cannot_include_a_backend SERIAL LABELS layering EXIT failure
  COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target weft_layering_plugin_violation
  EXPECT "tcp/tcp_rma.h: No such file or directory")
weft_test(NAME layering.plugin_table_includes_the_engine SERIAL LABELS layering
  COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target weft_layering_plugin_control)

# SPDX-License-Identifier: Apache-2.0
# How the suite's entries are declared. Every entry is judged by its exit code: 0 passes, 77 is a skip (the entry
# could not run here, and says why), anything else fails. Entries that also look at their output do so through
# tests/support/check_run.sh, which requires the exit code as well, never instead of it.
#
# Labels say what an entry needs, and so how it may run beside others (WEFT_TEST_JOBS=N: ctest -j N):
#   optional  needs what scripts/setup.sh does not install (a kernel module, the CUDA toolkit's NCCL): its skip
#             is allowed under CI=true; every other entry's skip fails a CI run.
# Resource locks (RESOURCE_LOCK) name what entries may not share: `cpu` for entries that judge time (a peer found
# dead within a bound, bandwidth shares, a benchmark) or take much of the machine (8 ranks, 2,048 connections): they
# run beside nothing else that holds `cpu`. The QEMU guests run alone (SERIAL).

# ';' inside an argument (tcp;ofi_rxm) is written %SEMI% and turned into an escaped ';' here.
function(_weft_unsemi out)
  set(cmd)
  foreach(a IN LISTS ARGN)
    string(REPLACE "%SEMI%" "\\;" a "${a}")
    list(APPEND cmd "${a}")
  endforeach()
  set(${out} "${cmd}" PARENT_SCOPE)
endfunction()

# A summary line with failures, in either harness's form ("conformance: 3 passed, 1 failed, ..." and
# "# 3 passed, 1 failed, ..."): the entry fails even if a wrapper lost the exit code.
set(WEFT_FAILED_SUMMARY ", [1-9][0-9]* failed")

# weft_test(NAME n COMMAND cmd... [TIMEOUT s] [LABELS l...] [ENV k=v...] [LOCKS r...] [SERIAL] [OPTIONAL] [LF2]
#           [EXPECT regex...] [REJECT regex...] [EXIT code|failure] [WORKING_DIRECTORY d])
#   ENV: set for the command (values may hold %SEMI%). LF2: the entry runs on libfabric 2.x instead (name suffix
#   .lf2, label libfabric2; declared only where scripts/libfabric2.sh has built it). SERIAL: alone (RUN_SERIAL).
#   EXPECT, REJECT, EXIT: through tests/support/check_run.sh, the command must exit with EXIT (0 by default;
#   `failure`: an error of its own, 1-125 and not 77, never a crash) and its output match every EXPECT and no
#   REJECT (grep -E over the whole output). An entry that expects a failure (EXIT not 0, or PROVOKES_FAILURES: a
#   script that makes a harness fail on purpose and judges that itself) has no failed-summary rule.
#   TIMEOUT defaults to 300.
function(weft_test)
  cmake_parse_arguments(T "SERIAL;OPTIONAL;LF2;PROVOKES_FAILURES" "NAME;TIMEOUT;EXIT;WORKING_DIRECTORY"
                        "COMMAND;LABELS;ENV;LOCKS;EXPECT;REJECT" ${ARGN})
  if(T_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "weft_test(${T_NAME}): unknown arguments ${T_UNPARSED_ARGUMENTS}")
  endif()
  set(name ${T_NAME})
  set(labels ${T_LABELS})
  set(env ${T_ENV})
  if(T_LF2)
    if(NOT WEFT_LF2_LIB)
      return()
    endif()
    set(name ${name}.lf2)
    list(APPEND labels libfabric2)
    list(PREPEND env LD_LIBRARY_PATH=${WEFT_LF2_LIB})  # an entry's own LD_LIBRARY_PATH (after) wins
  endif()
  if(T_OPTIONAL)
    list(APPEND labels optional)
  endif()
  # Everything stays a plain list, ';' written %SEMI%, until the one escape right before add_test.
  set(cmd ${T_COMMAND})
  if(DEFINED T_EXIT OR T_EXPECT OR T_REJECT)
    set(wrap ${PROJECT_SOURCE_DIR}/tests/support/check_run.sh)
    if(DEFINED T_EXIT)
      list(APPEND wrap --exit ${T_EXIT})
    endif()
    foreach(r IN LISTS T_EXPECT)
      list(APPEND wrap --expect "${r}")
    endforeach()
    foreach(r IN LISTS T_REJECT)
      list(APPEND wrap --reject "${r}")
    endforeach()
    set(cmd ${wrap} -- ${cmd})
  endif()
  if(env)
    set(cmd ${CMAKE_COMMAND} -E env ${env} ${cmd})
  endif()
  _weft_unsemi(cmd ${cmd})
  set(wd)
  if(T_WORKING_DIRECTORY)
    set(wd WORKING_DIRECTORY ${T_WORKING_DIRECTORY})
  endif()
  add_test(NAME ${name} COMMAND ${cmd} ${wd})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} SKIP_RETURN_CODE 77)
  if(NOT T_PROVOKES_FAILURES AND (NOT DEFINED T_EXIT OR T_EXIT STREQUAL "0"))
    set_tests_properties(${name} PROPERTIES FAIL_REGULAR_EXPRESSION "${WEFT_FAILED_SUMMARY}")
  endif()
  if(labels)
    set_tests_properties(${name} PROPERTIES LABELS "${labels}")
  endif()
  if(T_LOCKS)
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK "${T_LOCKS}")
  endif()
  if(T_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL ON)
  endif()
endfunction()

# The options weft_conformance and weft_rma hand on to weft_test as they are.
set(_WEFT_PASS_FLAGS SERIAL OPTIONAL LF2)
set(_WEFT_PASS_ONE EXIT)
set(_WEFT_PASS_MULTI LABELS LOCKS ENV EXPECT REJECT)
# Also gives TIMEOUT and LABELS their defaults where the caller named none.
macro(_weft_pass prefix out timeout label)
  if(NOT ${prefix}_TIMEOUT)
    set(${prefix}_TIMEOUT ${timeout})
  endif()
  if(NOT ${prefix}_LABELS)
    set(${prefix}_LABELS ${label})
  endif()
  set(${out} TIMEOUT ${${prefix}_TIMEOUT})
  foreach(f IN LISTS _WEFT_PASS_FLAGS)
    if(${prefix}_${f})
      list(APPEND ${out} ${f})
    endif()
  endforeach()
  foreach(f IN LISTS _WEFT_PASS_ONE _WEFT_PASS_MULTI)
    if(DEFINED ${prefix}_${f})
      list(APPEND ${out} ${f} ${${prefix}_${f}})
    endif()
  endforeach()
endmacro()

# The transports a net conformance entry runs over, as the plugin's variables (loopback where there is a choice).
set(WEFT_OVER_fabric-tcp --env WEFT_PROVIDER=tcp%SEMI%ofi_rxm --env WEFT_IFACE=lo)
set(WEFT_OVER_fabric-tcp-rdm --env WEFT_PROVIDER=tcp --env WEFT_IFACE=lo)  # 2.x's own reliable-datagram endpoint
set(WEFT_OVER_shm --env WEFT_PROVIDER=shm)
set(WEFT_OVER_sockets --env WEFT_PROVIDER=sockets --env WEFT_IFACE=lo)
set(WEFT_OVER_tcp --env WEFT_BACKEND=tcp --env WEFT_IFACE=lo)  # weft's own sockets

# weft_conformance(NAME n OVER transport|NETNS [script options...] [ARGS conformance args...] [weft_test options])
#   `weft conformance --plugin <weft> <transport> ARGS`; with NETNS, through tests/conformance/netns_conformance.sh
#   (its options first: --rails, --pairs, --link-down, --netem), between two network namespaces of its own.
#   TIMEOUT defaults to 900, LABELS to conformance.
function(weft_conformance)
  cmake_parse_arguments(C "SERIAL;OPTIONAL;LF2" "NAME;OVER;TIMEOUT;EXIT" "ARGS;NETNS;LABELS;LOCKS;ENV;EXPECT;REJECT"
                        ${ARGN})
  if(C_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "weft_conformance(${C_NAME}): unknown arguments ${C_UNPARSED_ARGUMENTS}")
  endif()
  if(DEFINED C_NETNS OR "NETNS" IN_LIST ARGN)
    set(cmd ${PROJECT_SOURCE_DIR}/tests/conformance/netns_conformance.sh ${C_NETNS} ${WEFT_BIN} ${WEFT_SO} ${C_ARGS})
  else()
    if(NOT DEFINED WEFT_OVER_${C_OVER})
      message(FATAL_ERROR "weft_conformance(${C_NAME}): OVER '${C_OVER}' is none of fabric-tcp, fabric-tcp-rdm, shm, sockets, tcp")
    endif()
    set(cmd ${WEFT_BIN} conformance --plugin ${WEFT_SO} ${WEFT_OVER_${C_OVER}} ${C_ARGS})
  endif()
  _weft_pass(C pass 900 conformance)
  weft_test(NAME ${C_NAME} COMMAND ${cmd} ${pass})
endfunction()

# The device API's transports, as the plugin's variables.
set(WEFT_RMA_tcp WEFT_BACKEND=tcp WEFT_RMA=on WEFT_IFACE=lo)
set(WEFT_RMA_fabric-tcp-rxm WEFT_BACKEND=fabric WEFT_RMA=fabric WEFT_PROVIDER=tcp%SEMI%ofi_rxm WEFT_IFACE=lo)
set(WEFT_RMA_fabric-tcp WEFT_BACKEND=fabric WEFT_RMA=fabric WEFT_PROVIDER=tcp WEFT_IFACE=^docker)
set(WEFT_RMA_fabric-shm WEFT_BACKEND=fabric WEFT_RMA=fabric WEFT_PROVIDER=shm)

# weft_rma(NAME n OVER transport [NETNS] [ARGS conformance --rma args...] [ENV k=v...] [weft_test options])
#   `weft conformance --rma --plugin <weft> ARGS` with the transport's variables (and ENV); with NETNS, through
#   tests/conformance/rma_netns.sh (even ranks in one namespace, odd in the other). LABELS default to device-api.
function(weft_rma)
  cmake_parse_arguments(R "SERIAL;OPTIONAL;LF2;NETNS" "NAME;OVER;TIMEOUT;EXIT" "ARGS;LABELS;LOCKS;ENV;EXPECT;REJECT"
                        ${ARGN})
  if(R_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "weft_rma(${R_NAME}): unknown arguments ${R_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT DEFINED WEFT_RMA_${R_OVER})
    message(FATAL_ERROR "weft_rma(${R_NAME}): OVER '${R_OVER}' is none of tcp, fabric-tcp-rxm, fabric-tcp, fabric-shm")
  endif()
  set(R_ENV ${WEFT_RMA_${R_OVER}} ${R_ENV})
  if(R_NETNS)
    list(FILTER R_ENV EXCLUDE REGEX "^WEFT_IFACE=")  # the script names the namespaces' interfaces
    set(cmd ${PROJECT_SOURCE_DIR}/tests/conformance/rma_netns.sh ${WEFT_BIN} ${WEFT_SO} ${R_ARGS})
  else()
    set(cmd ${WEFT_BIN} conformance --rma --plugin ${WEFT_SO} ${R_ARGS})
  endif()
  _weft_pass(R pass 300 device-api)
  weft_test(NAME ${R_NAME} COMMAND ${cmd} ${pass})
endfunction()

# SPDX-License-Identifier: Apache-2.0
# Real ibverbs on soft-RoCE inside QEMU guests booted with Debian's kernel (tests/rxe/run_guest.sh; the emulator,
# kernel and guest tools come from scripts/setup.sh: skipped, 77, only where they cannot be installed). Emulation
# without KVM takes both cores, and the checks inside judge time (a dead rank found within a bound): each guest runs
# alone. Declared first, they run first.
set(_guest ${PROJECT_SOURCE_DIR}/tests/rxe/run_guest.sh)
set(_builtin ${PROJECT_SOURCE_DIR}/tests/conformance/nccl_builtin_build.sh)

# Native verbs (every table version, 4 QPs, dead and unreachable peers, QP errors) and libfabric's verbs;ofi_rxm.
# NCCL's own IB transport runs there too, built on the host first where the CUDA toolkit's libnccl.so.2 is (the
# guest step says so and leaves it out where it is not).
# The steps marked --long in tests/rxe/guest_tests.sh (the middle table versions, every check on v12) run in the
# long run's own guest (rxe.guest.long).
foreach(part core long)
  set(_n rxe.guest)
  set(_l rxe)
  if(part STREQUAL long)
    set(_n rxe.guest.long)
    set(_l rxe long)
  endif()
  weft_test(NAME ${_n} TIMEOUT 1800 LABELS ${_l} SERIAL
    ENV RXE_BIN=${WEFT_BIN} RXE_SO=${WEFT_SO} RXE_FAULT_BIN=$<TARGET_FILE:weft_verbs_fault_tests> RXE_PART=${part}
        RXE_MOCK_CUDA=${WEFT_MOCK_CUDA_DIR} RXE_NCCL_IB=${CMAKE_BINARY_DIR}/nccl-builtin/libnccl-net-ncclNetIb.so
    COMMAND bash -c "${_builtin} ncclNetIb ${CMAKE_BINARY_DIR}/nccl-builtin%SEMI% exec ${_guest} ${PROJECT_SOURCE_DIR}/tests/rxe/guest_tests.sh ${CMAKE_BINARY_DIR}/${_n} 1500")
endforeach()

# The device API's harness against NCCL's own GIN IB proxy (ncclGinIbProxy in the CUDA toolkit's libnccl.so.2, as a
# plugin file built on the host): every check that is not weft.* must pass there; weft's TCP RMA in the same guest,
# and weft's verbs RMA with both ways of signalling, on host memory and on GPU memory under the mock driver.
weft_test(NAME rxe.guest.gin TIMEOUT 1200 LABELS rxe SERIAL
  ENV RXE_BIN=${WEFT_BIN} RXE_SO=${WEFT_SO} RXE_MOCK_CUDA=${WEFT_MOCK_CUDA_DIR}
      RXE_NCCL_GIN=${CMAKE_BINARY_DIR}/nccl-builtin/libnccl-net-ncclGinIbProxy.so
  COMMAND bash -c "${_builtin} ncclGinIbProxy ${CMAKE_BINARY_DIR}/nccl-builtin%SEMI% exec ${_guest} ${PROJECT_SOURCE_DIR}/tests/rxe/guest_gin.sh ${CMAKE_BINARY_DIR}/rxe-gin 900")

# Rail failover over real (emulated) verbs: two NICs and two soft-RoCE devices fused into one two-rail device of
# verbs;ofi_rxm; one NIC taken down under load.
weft_test(NAME rxe.guest.rails TIMEOUT 900 LABELS rxe SERIAL ENV RXE_BIN=${WEFT_BIN} RXE_SO=${WEFT_SO} RXE_NICS=2
  COMMAND ${_guest} ${PROJECT_SOURCE_DIR}/tests/rxe/guest_rails.sh ${CMAKE_BINARY_DIR}/rxe-rails 600)

# 2.x's verbs;ofi_rxm, both protocols (tests/rxe/guest_lf2.sh; the guest loads 2.x, the host needs none of it).
if(WEFT_LF2_LIB)
  weft_test(NAME rxe.guest.lf2 TIMEOUT 1500 LABELS rxe libfabric2 SERIAL
    ENV RXE_BIN=${WEFT_BIN} RXE_SO=${WEFT_SO} RXE_FABRIC_LIB=${WEFT_LF2_LIB}
    COMMAND ${_guest} ${PROJECT_SOURCE_DIR}/tests/rxe/guest_lf2.sh ${CMAKE_BINARY_DIR}/rxe-lf2 1200)
endif()

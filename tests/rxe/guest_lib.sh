# SPDX-License-Identifier: Apache-2.0
# Sourced by the scripts the soft-RoCE guest runs (tests/rxe/run_guest.sh): one test step and its verdict.
fails=0
# step [--long] NAME TIMEOUT COMMAND...: runs COMMAND (its output in step-NAME.log), prints its verdict lines and the
# outcome; a failure counts in $fails. STEP_BEFORE, when set, runs first (a command of the script's). RXE_PART picks
# the steps: core (those without --long), long (those with it) or all (the default).
step() {
  long=0
  if [ "$1" = --long ]; then long=1; shift; fi
  case "${RXE_PART:-all}:$long" in
    core:1) echo "STEP $1: in the long run (RXE_PART=long, ctest rxe.guest.long)"; return 0 ;;
    long:0) return 0 ;;
  esac
  name=$1; limit=$2; shift 2
  [ -n "${STEP_BEFORE:-}" ] && $STEP_BEFORE
  t0=$(date +%s)
  timeout "$limit" "$@" > "step-$name.log" 2>&1
  rc=$?
  t1=$(date +%s)
  grep -E "^\[(PASS|FAIL|SKIP)\]|^conformance:|^FAIL |^# [0-9]+ passed|^rma |detected after|kept working|failed after|^netem |^(recv|send)\s+(down|flap|failover)|^crash" "step-$name.log" | sed "s/^/  /"
  if [ $rc -eq 0 ]; then echo "STEP $name: ok ($((t1 - t0)) s)"; else echo "STEP $name: FAILED rc=$rc ($((t1 - t0)) s), see step-$name.log"; tail -15 "step-$name.log"; fails=$((fails + 1)); fi
}

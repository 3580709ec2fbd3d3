#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs a command and judges it by its exit code first, then by its output (for the entries that check what a
# command says, weft_test's EXPECT, REJECT and EXIT in tests/cmake/weft_test.cmake): the output is printed whole, then
#   --exit N        the exit code required (default 0); `failure`: an error of the command's own, 1-125 but not 77
#                   (a crash, a signal or a skip is not the failure asked for);
#   --expect REGEX  the output must match (grep -E over the whole output: '.' matches a newline too);
#   --reject REGEX  the output must not match.
# Exit 0 when all hold; 77 when the command itself skipped (77) and no other exit was asked for; 1 otherwise.
# usage: check_run.sh [--exit N|failure] [--expect REGEX]... [--reject REGEX]... -- COMMAND [ARGS...]
set -u
want=0 expects=() rejects=()
while [ $# -gt 0 ]; do
  case "$1" in
    --exit) want=$2; shift 2 ;;
    --expect) expects+=("$2"); shift 2 ;;
    --reject) rejects+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "check_run: unknown option '$1'"; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "check_run: no command"; exit 2; }
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
verdict=0
if [ "$want" = failure ]; then
  if [ "$rc" -lt 1 ] || [ "$rc" -gt 125 ] || [ "$rc" -eq 77 ]; then
    echo "check_run: FAIL: exit $rc, where a failure of the command's own (1-125, not 77) was expected"; verdict=1
  fi
elif [ "$rc" -ne "$want" ]; then
  if [ "$rc" -eq 77 ] && [ "$want" -eq 0 ]; then echo "check_run: the command skipped (exit 77)"; exit 77; fi
  echo "check_run: FAIL: exit $rc, expected $want"; verdict=1
fi
for r in "${expects[@]}"; do
  printf '%s' "$out" | grep -zqE -- "$r" || { echo "check_run: FAIL: the output does not match: $r"; verdict=1; }
done
for r in "${rejects[@]}"; do
  if printf '%s' "$out" | grep -zqE -- "$r"; then echo "check_run: FAIL: the output matches: $r"; verdict=1; fi
done
[ $verdict -eq 0 ] && echo "check_run: ok (exit $rc${expects:+, every expected line})"
exit $verdict

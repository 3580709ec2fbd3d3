#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The topology fixtures are what their generator writes: every file it makes is in the repository, byte for byte,
# and every fixture in the repository is one it makes.
# usage: tests/topology/fixtures_current.sh FIXTURE_DIR
set -u
dir=$1
d=$(mktemp -d /tmp/weft-fixtures-XXXXXX)
trap 'rm -rf "$d"' EXIT
python3 "$dir/make_fixtures.py" "$d" || { echo "FAIL: make_fixtures.py failed"; exit 1; }
made=$(cd "$d" && ls -- *.xml 2>/dev/null | sort)
kept=$(cd "$dir" && ls -- *.xml 2>/dev/null | sort)
[ -n "$made" ] || { echo "FAIL: make_fixtures.py wrote no fixture"; exit 1; }
[ "$made" = "$kept" ] || { echo "FAIL: the generator makes {$made}, the repository keeps {$kept}"; exit 1; }
for f in $made; do
  diff -q "$d/$f" "$dir/$f" || { echo "FAIL: $f is not what make_fixtures.py writes (run it into $dir)"; exit 1; }
done
echo "$(wc -w <<< "$made") fixtures current"

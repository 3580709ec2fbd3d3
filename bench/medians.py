#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Medians over rounds of `weft bench --json` runs, one table, ratios to a reference configuration.
#
#   bench/medians.py DIR BASE [TITLE]
#
# DIR holds one file per run, named <label>.<round> (each `weft bench --json` output); BASE is the label the ratios
# are to (its column first). A run that failed (not JSON) is left out, and said so.
import glob
import json
import os
import statistics
import sys


def main():
    raw, base = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else "Gb/s"
    data, order, rounds = {}, [], set()
    for path in sorted(glob.glob(os.path.join(raw, "*"))):
        label, rnd = os.path.basename(path).rsplit(".", 1)
        rounds.add(rnd)
        if label not in order:
            order.append(label)
        try:
            results = json.load(open(path))["results"]
        except (ValueError, KeyError):
            print(f"medians.py: {os.path.basename(path)} is no bench result: left out", file=sys.stderr)
            continue
        for x in results:
            key = f"{x['pattern']} {x.get('bytes', x.get('connections', ''))}"
            value = x["plugin"].get("gbps", x["plugin"].get("median_us"))
            if value is not None:
                data.setdefault(label, {}).setdefault(key, []).append(value)
    seen = list(order)
    order = sorted(seen, key=lambda l: (l != base, seen.index(l)))
    metrics = list(dict.fromkeys(m for l in order for m in data.get(l, {})))
    print(f"{title}, {len(rounds)} alternating rounds, medians (ratio to {base}; latency: time)")
    print(f"{'metric':18}" + "".join(f"{l:>18}" for l in order))
    for m in metrics:
        row = f"{m:18}"
        for l in order:
            v = data.get(l, {}).get(m)
            b = data.get(base, {}).get(m)
            if not v:
                row += f"{'-':>18}"
                continue
            med = statistics.median(v)
            row += f"{med:>10.2f} ({med / statistics.median(b):4.2f})" if b else f"{med:>18.2f}"
        print(row)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Medians over rounds of `weft bench --json` runs, one table, ratios to a reference configuration.
#
#   bench/medians.py DIR BASE [TITLE] [--pair SUFFIX]
#
# DIR holds one file per run, named <label>.<round>[.<part>] (a `weft bench --json` output, its JSON line the last
# one that starts with "{": a wrapper's own lines before it are skipped; parts: runs of one round with different
# settings, such as the conns pattern's message size); BASE is the label the ratios are to (its column first). A run
# that failed (no JSON) is left out, and said so. --pair SUFFIX: a label ending in SUFFIX has its ratio to the same
# label without it (an A/B of one setting, such as +numa), every other label to BASE.
import glob
import json
import os
import statistics
import sys


def metric(x):
    """A result's row name: the pattern and its point (bytes, or connections and their message size)."""
    if "bytes" in x:
        return f"{x['pattern']} {x['bytes']}"
    n = x.get("connections", "")
    key = f"{x['pattern']} {n} conn{'s' if n != 1 else ''}"
    mb = x.get("message_bytes")
    if mb:
        key += f", {mb >> 20} MiB" if mb % (1 << 20) == 0 else f", {mb} B"
    return key


def main():
    args, pair = list(sys.argv[1:]), None
    if "--pair" in args:
        i = args.index("--pair")
        pair = args[i + 1]
        del args[i:i + 2]
    raw, base = args[0], args[1]
    title = args[2] if len(args) > 2 else "Gb/s"
    data, order, rounds = {}, [], set()
    for path in sorted(glob.glob(os.path.join(raw, "*"))):
        label, rnd = (os.path.basename(path).split(".") + [""])[:2]
        rounds.add(rnd)
        if label not in order:
            order.append(label)
        try:
            lines = [l for l in open(path, errors="replace") if l.startswith("{")]
            results = json.loads(lines[-1])["results"]
        except (ValueError, KeyError, IndexError):
            print(f"medians.py: {os.path.basename(path)} is no bench result: left out", file=sys.stderr)
            continue
        for x in results:
            key = metric(x)
            value = x["plugin"].get("gbps", x["plugin"].get("median_us"))
            if value is not None:
                data.setdefault(label, {}).setdefault(key, []).append(value)
    seen = list(order)
    order = sorted(seen, key=lambda l: (l != base, seen.index(l)))
    metrics = list(dict.fromkeys(m for l in order for m in data.get(l, {})))
    paired = f", {pair} to the same without it" if pair else ""
    print(f"{title}, {len(rounds)} alternating rounds, medians (ratio to {base}{paired}; latency: time)")
    print(f"{'metric':22}" + "".join(f"{l:>18}" for l in order))
    for m in metrics:
        row = f"{m:22}"
        for l in order:
            ref = l[:-len(pair)] if pair and l.endswith(pair) and l[:-len(pair)] in data else base
            v = data.get(l, {}).get(m)
            b = data.get(ref, {}).get(m)
            if not v:
                row += f"{'-':>18}"
                continue
            med = statistics.median(v)
            row += f"{med:>10.2f} ({med / statistics.median(b):4.2f})" if b else f"{med:>18.2f}"
        print(row)


if __name__ == "__main__":
    main()

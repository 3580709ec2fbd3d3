#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Reads nccl-tests output: verification, bus bandwidth per size, and weft-vs-baseline comparison.

    nccl_tests_report.py check LOG            exit 1 unless the run verified (no #wrong, "Out of bounds ... OK")
                                              and NCCL loaded weft (a "NET/weft" line)   [--baseline: not weft]
    nccl_tests_report.py busbw LOG            size and out-of-place busbw per row, one per line
    nccl_tests_report.py compare WEFT BASE    a table of busbw per size, weft / baseline ratio, and the geomean
"""
import math
import sys


def parse(text):
    """Rows of the nccl-tests table: dicts with size, time_us, algbw, busbw, wrong (out-of-place), and in-place
    time/busbw/wrong when present. Handles the layouts with and without the root column, and N/A in #wrong."""
    rows, cols = [], None
    for line in text.splitlines():
        tok = line.split()
        if not tok:
            continue
        if tok[0] == "#":
            if len(tok) > 4 and tok[1] == "size" and tok[2] == "count":
                names = tok[1:]
                cols = [i for i, n in enumerate(names) if n == "time"]
            continue
        if cols is None or not tok[0].isdigit():
            continue
        try:
            t = cols[0]
            row = {"size": int(tok[0]), "time_us": float(tok[t]), "algbw": float(tok[t + 1]),
                   "busbw": float(tok[t + 2]), "wrong": tok[t + 3]}
            if len(cols) > 1 and len(tok) > cols[1] + 3:
                t2 = cols[1]
                row.update({"ip_time_us": float(tok[t2]), "ip_busbw": float(tok[t2 + 2]), "ip_wrong": tok[t2 + 3]})
        except (ValueError, IndexError):
            continue  # a line that only looks like a row (interleaved logs)
        rows.append(row)
    return rows


def wrong_count(value):
    if value in ("N/A", "-"):
        return 0  # validation off (-c 0): nothing was checked
    try:
        return int(float(value))
    except ValueError:
        return 1


def check(text, expect_weft=True):
    problems = []
    rows = parse(text)
    if not rows:
        problems.append("no nccl-tests result rows")
    bad = [r["size"] for r in rows if wrong_count(r["wrong"]) or wrong_count(r.get("ip_wrong", "0"))]
    if bad:
        problems.append("wrong results at sizes %s" % bad)
    if "Out of bounds values : 0 OK" not in text and rows:
        problems.append('no "Out of bounds values : 0 OK" line')
    has_weft = "NET/weft" in text
    if expect_weft and not has_weft:
        problems.append("NCCL did not load weft (no NET/weft line; is NCCL_DEBUG=INFO set, the plugin on the path?)")
    if not expect_weft and has_weft:
        problems.append("the baseline run loaded weft")
    return problems


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compare(weft_text, base_text):
    w = {r["size"]: r["busbw"] for r in parse(weft_text)}
    b = {r["size"]: r["busbw"] for r in parse(base_text)}
    out = ["%12s %12s %12s %8s" % ("size (B)", "weft GB/s", "socket GB/s", "ratio")]
    ratios = []
    for size in sorted(set(w) | set(b)):
        wv, bv = w.get(size), b.get(size)
        ratio = wv / bv if wv is not None and bv else None
        if ratio is not None and size >= 1 << 16:
            ratios.append(ratio)
        out.append("%12d %12s %12s %8s" % (size, "-" if wv is None else "%.3f" % wv, "-" if bv is None else "%.3f" % bv,
                                          "-" if ratio is None else "%.3f" % ratio))
    out.append("geomean ratio (sizes >= 64 KiB): %.3f" % geomean(ratios))
    return "\n".join(out)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("check", "busbw", "compare"):
        sys.stderr.write(__doc__)
        return 2
    read = lambda p: open(p, errors="replace").read()
    if argv[1] == "check":
        problems = check(read(argv[2]), expect_weft="--baseline" not in argv)
        for p in problems:
            print("FAIL %s: %s" % (argv[2], p))
        return 1 if problems else 0
    if argv[1] == "busbw":
        for r in parse(read(argv[2])):
            print(r["size"], r["busbw"])
        return 0
    if len(argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    print(compare(read(argv[2]), read(argv[3])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What a ctest run cost and what it skipped, read from its JUnit file and the suite's labels.

Prints, per label, how many entries passed, failed and were skipped and the seconds they took (summed: entries run
side by side, so the sum exceeds the run's wall time), then every skipped entry with its reason. With --ci (CI=true),
a skip of an entry not labelled `optional` (nor a Catch2 case that printed "SKIPPED (optional):") fails: CI has
everything scripts/setup.sh installs, so such a skip means something that should have run did not.

usage: test_report.py JUNIT_XML TESTS_JSON [--ci]
  JUNIT_XML   ctest --output-junit's file
  TESTS_JSON  ctest --show-only=json-v1's output (the entries' labels)
Exit 0, or 1 when --ci and a required entry skipped; 2 when the files cannot be read.
"""
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def labels_of(tests_json):
    out = {}
    for t in tests_json.get("tests", []):
        labels = []
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels = list(p.get("value") or [])
        out[t["name"]] = labels
    return out


def skip_reason(text):
    """The line an entry gave for its skip (SKIP..., SKIPPED..., skipped: ...), else its last line."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    for l in reversed(lines):
        if re.search(r"\bSKIP(PED)?\b|\bskipped\b|exit 77", l):
            return l[:200]
    return lines[-1][:200] if lines else "(no output)"


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    ci = "--ci" in argv
    if len(args) != 2:
        print(__doc__)
        return 2
    try:
        root = ET.parse(args[0]).getroot()
        with open(args[1]) as f:
            labels = labels_of(json.load(f))
    except (OSError, ET.ParseError, json.JSONDecodeError) as e:
        print(f"test_report: cannot read the run's files: {e}")
        return 2

    per = defaultdict(lambda: {"n": 0, "pass": 0, "fail": 0, "skip": 0, "sec": 0.0})
    skipped = []
    outputs = {}
    for tc in root.iter("testcase"):
        name = tc.get("name")
        sec = float(tc.get("time") or 0)
        if tc.find("failure") is not None or tc.find("error") is not None:
            state = "fail"
        elif tc.find("skipped") is not None or tc.get("status") in ("notrun", "disabled"):
            state = "skip"
            out = tc.findtext("system-out") or ""
            outputs[name] = out
            sk = tc.find("skipped")
            skipped.append((name, skip_reason(out) if out else (sk.get("message") if sk is not None else "")))
        else:
            state = "pass"
        for lab in labels.get(name) or ["(none)"]:
            e = per[lab]
            e["n"] += 1
            e[state] += 1
            e["sec"] += sec

    print("=== time per label (seconds summed over its entries; an entry counts under each of its labels) ===")
    print(f"{'label':<12} {'entries':>7} {'passed':>7} {'failed':>7} {'skipped':>8} {'seconds':>9}")
    for lab in sorted(per, key=lambda l: -per[l]["sec"]):
        e = per[lab]
        print(f"{lab:<12} {e['n']:>7} {e['pass']:>7} {e['fail']:>7} {e['skip']:>8} {e['sec']:>9.0f}")
    total = sum(float(tc.get("time") or 0) for tc in root.iter("testcase"))
    print(f"{'all':<12} {sum(1 for _ in root.iter('testcase')):>7} {'':>7} {'':>7} {'':>8} {total:>9.0f}")

    bad = []
    if skipped:
        print("=== skipped entries ===")
        for name, why in skipped:
            # Labelled optional, or a Catch2 case that said so itself (tests/support/skip.h: its skips of what
            # setup.sh installs fail under CI=true instead of skipping).
            optional = "optional" in (labels.get(name) or []) or "SKIPPED (optional):" in outputs.get(name, "")
            print(f"  {name}{' (optional)' if optional else ''}: {why}")
            if not optional:
                bad.append(name)
    if ci and bad:
        print(f"test_report: CI=true and {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} skipped that need only what "
              f"scripts/setup.sh installs: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

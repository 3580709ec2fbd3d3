#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""all_reduce bus bandwidth per message size through torch.distributed (NCCL), every result verified.

Launcher (run it directly):
    scripts/e2e/torch-allreduce-sweep.py [--procs 2] [--max-mb 128] [--out DIR] [--runs weft,tcp,socket]
It runs the same sweep under torchrun once per transport, each rank made to look like a node of its own
(rank_env.sh), so that NCCL's traffic goes through the network:
    weft    NCCL_NET_PLUGIN=weft over libfabric (WEFT_PROVIDER, default tcp;ofi_rxm)
    tcp     NCCL_NET_PLUGIN=weft with WEFT_BACKEND=tcp (weft's own sockets)
    tcp2    the same with WEFT_TCP_FLOWS=2 (two flows per connection)
    tcp-untimed  the same with WEFT_TIMING=0 (weft's profiler loaded, asking NCCL for no events)
    tcp-bare     the same with NCCL_PROFILER_PLUGIN=none NCCL_TUNER_PLUGIN=none (the transport alone)
    socket-timed NCCL Socket with weft's profiler (libnccl-profiler-weft.so): what timing costs
    socket-untimed   the same with WEFT_TIMING=0 (the profiler loaded, asking for no events)
    socket-example0  NCCL Socket with NCCL's example profiler (WEFT_E2E_EXAMPLE_PROFILER: its file) asking for
                     no events (NCCL_PROFILE_EVENT_MASK=0): what any loaded profiler costs
A name may repeat (socket,tcp,socket,tcp): each run is a column of its own, numbered.
    socket  NCCL's internal Socket transport (the baseline)
and prints busbw per size side by side (medians of the timed iterations). Exit: 0 good; 1 a run failed or a
result was wrong; 2 bad arguments; 3 this machine cannot run it.

Worker (what torchrun runs): the same file with RANK/WORLD_SIZE set; writes $WEFT_E2E_SWEEP.<rank>.json.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

RUNS = ("weft", "tcp", "tcp2", "tcp-untimed", "tcp-bare", "socket", "socket-timed", "socket-untimed", "socket-example0")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def worker():
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    max_bytes = int(os.environ.get("WEFT_E2E_MAX_BYTES", str(128 << 20)))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    results, size, bad = [], 8, 0
    while size <= max_bytes:
        n = max(size // 4, 2)
        x = torch.empty(n, dtype=torch.float32, device="cuda")
        iters = 20 if size <= (1 << 20) else 10 if size <= (16 << 20) else 5
        times = []
        for i in range(3 + iters):
            x.fill_(float(rank + 1))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end) * 1e-3)
            want = float(world * (world + 1) // 2)
            if not bool(torch.all(x == want)):
                bad += 1
        t = statistics.median(times)
        algbw = n * 4 / t / 1e9
        results.append(dict(bytes=n * 4, time_us=t * 1e6, algbw=algbw, busbw=algbw * 2 * (world - 1) / world))
        size *= 4
    with open("%s.%d.json" % (os.environ["WEFT_E2E_SWEEP"], rank), "w") as f:
        json.dump(dict(results=results, wrong=bad, nccl=".".join(map(str, torch.cuda.nccl.version()))), f)
    dist.destroy_process_group()
    return 1 if bad else 0


def launch(args):
    names = args.runs.split(",")
    if not set(names) <= set(RUNS):
        print("torch-allreduce-sweep.py: unknown run in %r (%s)" % (args.runs, ", ".join(RUNS)), file=sys.stderr)
        return 2
    if shutil.which("torchrun") is None:
        print("torch-allreduce-sweep.py: torchrun is not on PATH", file=sys.stderr)
        return 3
    plugin = os.path.join(REPO, "build/lib/libnccl-net-weft.so")
    out = args.out or os.path.join(REPO, "build/e2e/sweep")
    os.makedirs(out, exist_ok=True)
    base = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_SOCKET_IFNAME="lo",
                WEFT_E2E_MAX_BYTES=str(args.max_mb << 20))
    runs = {
        "weft": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_BACKEND="fabric", WEFT_IFACE="lo",
                     WEFT_PROVIDER=os.environ.get("WEFT_PROVIDER", "tcp;ofi_rxm")),
        "tcp": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_BACKEND="tcp", WEFT_IFACE="lo"),
        "tcp2": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_BACKEND="tcp", WEFT_IFACE="lo", WEFT_TCP_FLOWS="2"),
        "tcp-untimed": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_BACKEND="tcp", WEFT_IFACE="lo",
                            WEFT_TIMING="0"),
        "tcp-bare": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_BACKEND="tcp", WEFT_IFACE="lo",
                         NCCL_PROFILER_PLUGIN="none", NCCL_TUNER_PLUGIN="none"),
        "socket": dict(NCCL_NET="Socket", NCCL_NET_PLUGIN="none"),
        "socket-timed": dict(NCCL_NET="Socket", NCCL_NET_PLUGIN="none",
                             NCCL_PROFILER_PLUGIN=os.path.join(REPO, "build/lib/libnccl-profiler-weft.so")),
        "socket-untimed": dict(NCCL_NET="Socket", NCCL_NET_PLUGIN="none", WEFT_TIMING="0",
                               NCCL_PROFILER_PLUGIN=os.path.join(REPO, "build/lib/libnccl-profiler-weft.so")),
        "socket-example0": dict(NCCL_NET="Socket", NCCL_NET_PLUGIN="none", NCCL_PROFILE_EVENT_MASK="0",
                                NCCL_PROFILER_PLUGIN=os.environ.get("WEFT_E2E_EXAMPLE_PROFILER", "none")),
    }
    failed, table = 0, {}
    for i, name in enumerate(names):
        col = name if names.count(name) == 1 else "%s#%d" % (name, names[:i + 1].count(name))
        env = dict(base, **runs[name], WEFT_E2E_SWEEP=os.path.join(out, "sweep-" + col))
        cmd = ["torchrun", "--standalone", "--nproc-per-node", str(args.procs), "--no-python",
               os.path.join(HERE, "rank_env.sh"), sys.executable, os.path.abspath(__file__)]
        log = os.path.join(out, col + ".log")
        print("== %s (log %s)" % (col, log), flush=True)
        with open(log, "w") as f:
            rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout)
        text = open(log, errors="replace").read()
        if rc != 0:
            print("FAIL: %s exited with %d" % (name, rc))
            failed = 1
            continue
        if not name.startswith("socket") and "NET/weft" not in text:
            print("FAIL: NCCL did not load weft in the %s run" % name)
            failed = 1
        res = json.load(open(os.path.join(out, "sweep-%s.0.json" % col)))
        if res["wrong"]:
            print("FAIL: %s: %d wrong results" % (name, res["wrong"]))
            failed = 1
        table[col] = res
    if table:
        print("NCCL %s, %d ranks on one GPU, busbw GB/s (median of the timed iterations)" %
              (next(iter(table.values()))["nccl"], args.procs))
        print("%12s" % "bytes" + "".join("%13s" % n for n in table))
        for i, r in enumerate(next(iter(table.values()))["results"]):
            print("%12d" % r["bytes"] + "".join("%13.3f" % table[n]["results"][i]["busbw"] for n in table))
    return failed


def main(argv):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and len(argv) == 1:
        return worker()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--max-mb", type=int, default=128)
    ap.add_argument("--out")
    ap.add_argument("--runs", default="weft,tcp,socket")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args(argv[1:])
    if not 2 <= args.procs <= 8 or args.max_mb < 1:
        ap.error("--procs 2..8, --max-mb >= 1")
    return launch(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

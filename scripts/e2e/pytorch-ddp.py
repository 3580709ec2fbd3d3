#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An unchanged PyTorch DDP job through weft: only environment variables differ between the runs.

Launcher (run it directly):
    scripts/e2e/pytorch-ddp.py [--procs 2] [--steps 30] [--out DIR] [--timing] [--tuner-profile FILE]
It starts the same training twice with torchrun (2-4 processes on one GPU, each made to look like a node of its
own, so that NCCL's traffic goes through the network plugin): once with NCCL_NET_PLUGIN=weft (NCCL_NET=weft: no
silent fallback) and once on NCCL's Socket transport, then checks that NCCL loaded weft, that the losses of the
two runs match step by step, and (with --timing) that per-collective records and the tuner's decision log exist.
    scripts/e2e/pytorch-ddp.py --compare A.json B.json     compare two recorded loss files
Exit: 0 good; 1 a check failed; 2 bad arguments; 3 this machine cannot run it (says what is missing).

Worker (what torchrun runs): the same file with RANK/WORLD_SIZE set: a small MLP on synthetic data, fixed seeds,
DDP over NCCL, the loss per step written to $WEFT_E2E_LOSSES.<rank>.json.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def compare_losses(a, b, rtol=1e-4, atol=1e-6):
    """Problems (a list of strings) between two loss sequences; empty when they match."""
    problems = []
    if len(a) != len(b):
        problems.append("the runs made %d and %d steps" % (len(a), len(b)))
    for i, (x, y) in enumerate(zip(a, b)):
        if not (math.isfinite(x) and math.isfinite(y)):
            problems.append("step %d: loss is not finite (%r, %r)" % (i, x, y))
        elif abs(x - y) > atol + rtol * abs(y):
            problems.append("step %d: loss %.8g with weft, %.8g without" % (i, x, y))
    return problems


def worker():
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    steps = int(os.environ.get("WEFT_E2E_STEPS", "30"))
    torch.manual_seed(1234)
    torch.cuda.set_device(0)  # every rank on the one GPU
    dist.init_process_group("nccl")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    ddp = DDP(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 1024, device="cuda", generator=gen)
        y = torch.randn(64, 1024, device="cuda", generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # gradients all-reduced by DDP through NCCL
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    with open("%s.%d.json" % (os.environ["WEFT_E2E_LOSSES"], rank), "w") as f:
        json.dump(losses, f)
    dist.destroy_process_group()
    return 0


def missing_requirements(procs):
    missing = []
    try:
        import torch  # noqa: F401
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            missing.append("a CUDA GPU visible to PyTorch")
        elif not torch.distributed.is_nccl_available():
            missing.append("PyTorch built with NCCL")
    except ImportError:
        missing.append("PyTorch (pip install torch)")
    if shutil.which("torchrun") is None:
        missing.append("torchrun on PATH")
    if not os.path.exists(os.path.join(REPO, "build/lib/libnccl-net-weft.so")):
        missing.append("weft's build (build/lib/libnccl-net-weft.so: run scripts/build.sh)")
    if not 2 <= procs <= 8:
        missing.append("--procs between 2 and 8")
    return missing


def launch(args):
    missing = missing_requirements(args.procs)
    if missing:
        sys.stderr.write("pytorch-ddp.py: this machine cannot run the end-to-end test; missing:\n")
        for m in missing:
            sys.stderr.write("  - %s\n" % m)
        return 3
    out = args.out or os.path.join(REPO, "build/e2e/pytorch-ddp")
    os.makedirs(out, exist_ok=True)
    plugin = os.path.join(REPO, "build/lib/libnccl-net-weft.so")
    base_env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,TUNING", NCCL_SOCKET_IFNAME="lo",
                    WEFT_E2E_STEPS=str(args.steps), NCCL_NET_PLUGIN_REF_COUNT="1",
                    LD_LIBRARY_PATH=os.path.join(REPO, "build/lib") + ":" + os.environ.get("LD_LIBRARY_PATH", ""))
    runs = {
        "weft": dict(NCCL_NET_PLUGIN=plugin, NCCL_NET="weft", WEFT_PROVIDER=os.environ.get("WEFT_PROVIDER", "tcp;ofi_rxm"),
                     WEFT_IFACE="lo"),
        "socket": dict(NCCL_NET="Socket", NCCL_NET_PLUGIN="none"),
    }
    if args.timing:
        runs["weft"].update(WEFT_TELEMETRY_DIR=os.path.join(out, "telemetry"), WEFT_TUNER_LOG="1")
        if args.tuner_profile:
            runs["weft"]["WEFT_TUNER_PROFILE"] = os.path.abspath(args.tuner_profile)
    losses = {}
    for name, extra in runs.items():
        env = dict(base_env, **extra, WEFT_E2E_LOSSES=os.path.join(out, "losses-" + name))
        cmd = ["torchrun", "--standalone", "--nproc-per-node", str(args.procs), "--no-python",
               os.path.join(HERE, "rank_env.sh"), sys.executable, os.path.abspath(__file__)]
        log = os.path.join(out, name + ".log")
        print("== %s: %s (log %s)" % (name, " ".join(cmd), log))
        with open(log, "w") as f:
            rc = subprocess.call(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        if rc != 0:
            print("FAIL: the %s run exited with %d (see %s)" % (name, rc, log))
            return 1
        with open(os.path.join(out, "losses-%s.0.json" % name)) as f:
            losses[name] = json.load(f)
    problems = []
    weft_log = open(os.path.join(out, "weft.log"), errors="replace").read()
    if "NET/weft" not in weft_log:
        problems.append("NCCL did not load weft in the weft run")
    if "NET/weft" in open(os.path.join(out, "socket.log"), errors="replace").read():
        problems.append("the baseline run loaded weft")
    problems += compare_losses(losses["weft"], losses["socket"])
    if args.timing:
        tel = os.path.join(out, "telemetry")
        records = 0
        for fn in os.listdir(tel) if os.path.isdir(tel) else []:
            records += sum(1 for line in open(os.path.join(tel, fn)) if '"type":"coll"' in line)
        print("timing: %d per-collective records in %s; tuner log lines: %d" %
              (records, tel, weft_log.count("NET/weft : tuner:")))
        if records == 0:
            problems.append("--timing gave no per-collective records")
    for p in problems:
        print("FAIL: " + p)
    print("losses match over %d steps (first %.6f, last %.6f)" % (len(losses["weft"]), losses["weft"][0],
                                                                  losses["weft"][-1]) if not problems else "")
    return 1 if problems else 0


def main(argv):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and len(argv) == 1:
        return worker()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out")
    ap.add_argument("--timing", action="store_true")
    ap.add_argument("--tuner-profile")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    args = ap.parse_args(argv[1:])
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.tuner_profile:
        args.timing = True
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        problems = compare_losses(a, b)
        for p in problems:
            print("FAIL: " + p)
        return 1 if problems else 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))

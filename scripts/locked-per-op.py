#!/usr/bin/env python3
"""Atomic read-modify-writes (x86 `lock`-prefixed instructions and `xchg` with memory) one op of
a training step executes, counted by callgrind, with the functions that execute them.

Each costs about 5 ns on this project's machines even uncontended (a C loop of
`__atomic_fetch_add`: 5.1 ns against 0.3 ns for a plain add), so beside the instruction count
(`scripts/instructions-per-step.sh`) this is the other deterministic measure of what the engine
adds to an op. Only the bench binary's own code is counted (Rust's std, Burn and burn-spill are
linked into it); the C library's allocator is not.

    scripts/locked-per-op.py [--top N] [model] [modes...]
    scripts/locked-per-op.py transformer plain none 200 30

Runs `step_profile` for 20 and 60 steps per mode and divides the difference by 40 steps and by
the ops of the last recorded step that it prints. Needs valgrind and objdump (binutils).
STEP_PROFILE=path runs another build of the bench.
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_binary():
    if os.environ.get("STEP_PROFILE"):
        return os.environ["STEP_PROFILE"]
    subprocess.run(["cargo", "bench", "--bench", "step_profile", "--no-run", "-q"], cwd=ROOT,
                   check=True, stderr=subprocess.DEVNULL)
    found = [p for p in glob.glob(os.path.join(ROOT, "target/release/deps/step_profile-*"))
             if not p.endswith(".d")]
    return max(found, key=os.path.getmtime)


def locked_addresses(binary):
    """Addresses of the binary's locked instructions (callgrind reports a PIE's own code at its
    file addresses)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True,
                         text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(\S.*)", line)
        if m and (m.group(2).startswith("lock ")
                  or (m.group(2).startswith("xchg") and "(" in m.group(2))):
            found.add(int(m.group(1), 16))
    return found


def locked_by_function(profile, addresses, object_name):
    """Executions of `addresses` per function, from a `--dump-instr=yes` profile."""
    counts = collections.Counter()
    names = {"fn": {}, "ob": {}}
    fn = ob = None
    last = 0
    call_cost_next = False

    def name(kind, value):
        m = re.match(r"\((\d+)\)(?:\s+(.*))?", value)
        if not m:
            return value
        if m.group(2):
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), value)

    for line in open(profile):
        if line.startswith("ob="):
            ob = name("ob", line[3:].strip())
        elif line.startswith("fn="):
            fn = name("fn", line[3:].strip())
        elif line.startswith(("cfn=", "cfi=", "cob=")):
            if line.startswith("cfn="):
                name("fn", line[4:].strip())
            elif line.startswith("cob="):
                name("ob", line[4:].strip())
        elif line.startswith("calls="):
            call_cost_next = True
        elif line[:1] in "0123456789+-*":
            parts = line.split()
            token = parts[0]
            if token == "*":
                address = last
            elif token[0] in "+-":
                address = last + int(token, 0)
            else:
                address = int(token, 0)
            last = address
            if call_cost_next:
                # The inclusive cost of a call: not this function's own instructions.
                call_cost_next = False
                continue
            if ob and object_name in ob and address in addresses and len(parts) > 2:
                counts[fn] += int(parts[2])
    return counts


def profile(binary, model, mode, steps, directory):
    path = os.path.join(directory, f"{mode}-{steps}.out")
    run = subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes",
                          f"--callgrind-out-file={path}", binary, model, mode, str(steps)],
                         capture_output=True, text=True, check=True)
    ops = re.search(r"ops in the last recorded step Some\((\d+)\)", run.stdout)
    return path, int(ops.group(1)) if ops else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("model", nargs="?", default="transformer")
    parser.add_argument("modes", nargs="*", default=["plain", "none", "200"])
    args = parser.parse_args()
    binary = bench_binary()
    addresses = locked_addresses(binary)
    object_name = os.path.basename(binary)
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for mode in args.modes:
            short, _ = profile(binary, args.model, mode, 20, directory)
            long, ops = profile(binary, args.model, mode, 60, directory)
            results.append((mode, locked_by_function(short, addresses, object_name),
                            locked_by_function(long, addresses, object_name), ops))
    # `plain` prints no op count: the configured modes' count (the same ops) stands for it.
    ops_per_step = next((ops for *_, ops in results if ops), None)
    if not ops_per_step:
        sys.exit("step_profile printed no op count: add a configured mode (none, 200, ...)")
    for mode, before, after, _ in results:
        per_op = {f: (after[f] - before.get(f, 0)) / (40 * ops_per_step) for f in after}
        total = sum(per_op.values())
        print(f"{args.model} {mode}: {total:.2f} locked instructions per op "
              f"({ops_per_step} ops a step)")
        for f, n in sorted(per_op.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {n:6.2f}  {f}")


if __name__ == "__main__":
    main()

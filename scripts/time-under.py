#!/usr/bin/env python3
"""Time a training step spends under each of some functions (the function with everything it
calls), from a sampled profile with call stacks: what removing that function's work would save,
where `perf report`'s self time spreads it over its callees.

    perf record -e cpu-clock -F 2000 --call-graph dwarf,16384 -o perf.data \\
        target/release/deps/step_profile-<hash> transformer 30 1000
    scripts/time-under.py --data perf.data --hz 2000 --steps 1000 \\
        settle_after_op make_room_for '::victims$' begin_op

Each pattern is a regular expression matched against the symbol of every frame (inlined frames
included); a sample counts once under a pattern however many of its frames match. With
`--callees N` it also lists, per pattern, what the outermost matching frame called, N frames
deep. Stacks deeper than the copied stack (16 KiB above) lose their outer frames, so a function
far from the leaf is undercounted: the patterns that matter here (the engine's work after an
op) sit near the leaf. Needs `perf` (linux-perf).
"""
import argparse
import collections
import re
import subprocess


def stacks(data):
    """Each sample's frames, leaf first, as symbol names."""
    out = subprocess.run(["perf", "script", "-F", "ip,sym", "-i", data],
                         capture_output=True, text=True, check=True).stdout
    for block in out.split("\n\n"):
        frames = []
        for line in block.strip().splitlines():
            parts = line.strip().split(None, 1)
            if parts:
                frames.append(parts[1] if len(parts) > 1 else "?")
        if frames:
            yield frames


def short(symbol, width=110):
    """A symbol without its generic arguments, cut to `width`."""
    for _ in range(4):
        symbol = re.sub(r"<[^<>]*>", "", symbol)
    return symbol[:width]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("patterns", nargs="+", help="regular expressions over frame symbols")
    parser.add_argument("--data", default="perf.data")
    parser.add_argument("--hz", type=float, required=True, help="perf record's -F")
    parser.add_argument("--steps", type=int, required=True, help="steps the profiled run trained")
    parser.add_argument("--callees", type=int, default=0, metavar="N")
    args = parser.parse_args()

    patterns = [re.compile(p) for p in args.patterns]
    total = 0
    under = collections.Counter()
    callees = {p.pattern: collections.Counter() for p in patterns}
    for frames in stacks(args.data):
        total += 1
        for pattern in patterns:
            hits = [i for i, frame in enumerate(frames) if pattern.search(frame)]
            if not hits:
                continue
            under[pattern.pattern] += 1
            if args.callees:
                outer = hits[-1]
                below = frames[max(0, outer - args.callees):outer][::-1]
                callees[pattern.pattern][" <- ".join(map(short, below)) or "(its own code)"] += 1
    us_per_sample = 1e6 / args.hz / args.steps
    print(f"{total} samples, {us_per_sample:.3f} µs a step each")
    for pattern in patterns:
        n = under[pattern.pattern]
        print(f"{100 * n / max(total, 1):6.1f}%  {n * us_per_sample:9.1f} µs/step  {pattern.pattern}")
        for callee, m in callees[pattern.pattern].most_common(12):
            print(f"        {100 * m / max(total, 1):6.1f}%  {callee}")


if __name__ == "__main__":
    main()

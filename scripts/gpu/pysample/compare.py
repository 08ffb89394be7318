"""Shares of the HTTP process's main-thread samples by function, arm against arm.

usage: compare.py DIR [TOP]   DIR holds RUN.folded files named cCONC-ARM-ROUND.folded
(sitecustomize.py). For every function, the share of samples with it on the stack (inclusive)
and as the innermost frame (self), per arm (all its rounds together), the functions whose
inclusive share differs most between arms first.
"""
import collections
import glob
import os
import re
import sys


def load(path):
    incl, own, total = collections.Counter(), collections.Counter(), 0
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        n = int(n)
        total += n
        frames = stack.split(";")
        for f in set(frames):
            incl[f] += n
        own[frames[-1]] += n
    return incl, own, total


def main():
    d = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    arms = collections.defaultdict(lambda: [collections.Counter(), collections.Counter(), 0])
    for f in sorted(glob.glob(os.path.join(d, "*.folded"))):
        m = re.match(r"c(\d+)-(\w+)-(\d+)\.folded$", os.path.basename(f))
        if not m:
            continue
        incl, own, total = load(f)
        print(f"{os.path.basename(f)}: {total} samples")
        a = arms[m.group(2)]
        a[0].update(incl)
        a[1].update(own)
        a[2] += total
    names = sorted(arms)
    if not names:
        print("no samples")
        return
    share = {n: {k: v / max(arms[n][2], 1) for k, v in arms[n][0].items()} for n in names}
    own = {n: {k: v / max(arms[n][2], 1) for k, v in arms[n][1].items()} for n in names}
    funcs = set().union(*(share[n] for n in names))
    spread = lambda f: max(share[n].get(f, 0) for n in names) - min(share[n].get(f, 0) for n in names)
    print("inclusive % (self %) by arm: " + " | ".join(names))
    for f in sorted(funcs, key=spread, reverse=True)[:top]:
        cells = " | ".join(f"{share[n].get(f, 0) * 100:5.1f} ({own[n].get(f, 0) * 100:4.1f})" for n in names)
        print(f"  {f[:70]:70s} {cells}")


main()


def profiles(d, top):
    """cProfile's figures (PYSAMPLE_MODE=profile) per arm, per round on average: calls and own
    seconds, the functions whose own time differs most between arms first."""
    arms = collections.defaultdict(lambda: [collections.Counter(), collections.Counter(), 0])
    for f in sorted(glob.glob(os.path.join(d, "*.prof.txt"))):
        m = re.match(r"c(\d+)-(\w+)-(\d+)\.prof\.txt$", os.path.basename(f))
        if not m:
            continue
        a = arms[m.group(2)]
        a[2] += 1
        for line in open(f):
            nc, tt, _ct, name = line.rstrip("\n").split("\t")
            a[0][name] += int(nc)
            a[1][name] += float(tt)
    if not arms:
        return
    names = sorted(arms)
    calls = {n: {k: v / arms[n][2] for k, v in arms[n][0].items()} for n in names}
    own = {n: {k: v / arms[n][2] for k, v in arms[n][1].items()} for n in names}
    print("cProfile, per round: " + " | ".join(f"{n}: {arms[n][2]} rounds, {sum(own[n].values()):.2f} s own time" for n in names))
    funcs = set().union(*(own[n] for n in names))
    spread = lambda f: max(own[n].get(f, 0) for n in names) - min(own[n].get(f, 0) for n in names)
    print("own s (calls) by arm: " + " | ".join(names))
    for f in sorted(funcs, key=spread, reverse=True)[:top]:
        cells = " | ".join(f"{own[n].get(f, 0):7.3f} ({calls[n].get(f, 0):9.0f})" for n in names)
        print(f"  {f[:80]:80s} {cells}")


profiles(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)

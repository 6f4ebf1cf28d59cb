#!/usr/bin/env python3
"""Instructions per request from a callgrind dump, by function and by crate.

callgrind_annotate lists a function once per source file inlined into it; this merges those
entries, so each function appears once with its self cost (instructions in its own body,
inlined code included) and its inclusive cost (self plus the functions it calls). Also counts
heap allocations (calls into Rust's global allocator: alloc, alloc_zeroed, realloc) and clock
reads (calls to clock_gettime) per request.

usage: callgrind_top.py DUMP REQUESTS [--match TEXT] [--top N] [--baseline DUMP REQUESTS]
  --match TEXT  list only functions whose name contains TEXT (e.g. tollgate::)
  --baseline    also print, per crate and per function, the self cost minus the baseline's
                (e.g. tollgate minus the bare floor)
"""

import argparse
import re
from collections import defaultdict


# Rust's global allocator (the System allocator's entry points) and glibc's clock read.
ALLOCATIONS = re.compile(r"^__rustc::__rdl_(alloc|alloc_zeroed|realloc)$")
CLOCK_READS = re.compile(r"^clock_gettime")


def load(path):
    """Self cost per function, inclusive cost per function, and calls made per callee."""
    names = {}

    def name(text):
        m = re.match(r"\((\d+)\)(?: (.*))?", text)
        if not m:
            return text
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    self_cost, calls, call_counts = defaultdict(int), defaultdict(int), defaultdict(int)
    fn = callee = None
    in_call = False
    with open(path) as f:
        for line in f:
            if line.startswith("fn="):
                fn = name(line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                callee = name(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                in_call = True
                call_counts[callee] += int(line[6:].split()[0])
            elif line[:1].isdigit() or line[:1] in ("+", "-", "*"):
                fields = line.split()
                cost = int(fields[1]) if len(fields) > 1 else 0
                if in_call:
                    if callee != fn:  # recursion would count twice
                        calls[fn, callee] += cost
                    in_call = False
                else:
                    self_cost[fn] += cost
    inclusive = defaultdict(int, self_cost)
    for (caller, _), cost in calls.items():
        inclusive[caller] += cost
    return self_cost, inclusive, call_counts


def counted(call_counts, pattern):
    """Calls made to functions whose name matches `pattern`."""
    return sum(count for callee, count in call_counts.items() if pattern.search(callee))


def crate(function):
    """The crate a function belongs to: the first path segment, generics and wrappers unwrapped."""
    g = function
    while True:
        h = re.sub(r"^(core::ptr::drop_in_place<|<|&mut |&|\(|core::pin::Pin<)", "", g)
        if h == g:
            break
        g = h
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", g)
    if m:
        return m.group(1)
    if re.match(r"(_?_?(int_)?(malloc|free|realloc)|cfree|tcache|unlink|__mem|mem(cpy|set|move|cmp|chr))", g):
        return "libc malloc/mem*"
    return "(other: syscalls wrappers, fmt impls...)"


def short(function, width=150):
    for _ in range(3):
        function = re.sub(r"<[^<>]*>", "<..>", function)
    return function[:width]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dump")
    p.add_argument("requests", type=int)
    p.add_argument("--match", default="")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--baseline", nargs=2, metavar=("DUMP", "REQUESTS"))
    a = p.parse_args()
    n = a.requests
    self_cost, inclusive, call_counts = load(a.dump)
    total = sum(self_cost.values())

    def per_request(calls, requests):
        allocations = counted(calls, ALLOCATIONS)
        # A build that inlines the allocator's entry points (LTO) shows none: say so, not 0.
        shown = f"{allocations / requests:.2f}" if allocations else "? (no call into __rdl_alloc seen)"
        return f"{shown} heap allocations, {counted(calls, CLOCK_READS) / requests:.1f} clock reads per request"

    print(f"{a.dump}: {total:,} instructions, {total / n:,.0f} per request ({n} requests); "
          + per_request(call_counts, n))
    base_self, base_n = ({}, 1)
    if a.baseline:
        base_self, _, base_calls = load(a.baseline[0])
        base_n = int(a.baseline[1])
        base_total = sum(base_self.values())
        print(f"{a.baseline[0]}: {base_total:,} instructions, {base_total / base_n:,.0f} per request; "
              f"ratio {total / n / (base_total / base_n):.2f}; " + per_request(base_calls, base_n))

    by_crate, base_by_crate = defaultdict(int), defaultdict(int)
    for f, c in self_cost.items():
        by_crate[crate(f)] += c
    for f, c in base_self.items():
        base_by_crate[crate(f)] += c
    print("\nself instructions per request, by crate" + (" (this, baseline, difference)" if a.baseline else ""))
    for k in sorted(set(by_crate) | set(base_by_crate), key=lambda k: -by_crate[k])[:16]:
        if a.baseline:
            print(f"{by_crate[k] / n:9,.0f} {base_by_crate[k] / base_n:9,.0f} {by_crate[k] / n - base_by_crate[k] / base_n:+9,.0f}  {k}")
        else:
            print(f"{by_crate[k] / n:9,.0f}  {k}")

    print(f"\ntop functions by inclusive instructions per request{' matching ' + a.match if a.match else ''}"
          " (inclusive, self)")
    rows = sorted((c, f) for f, c in inclusive.items() if a.match in f)[::-1][: a.top]
    for c, f in rows:
        print(f"{c / n:9,.0f} {self_cost[f] / n:8,.0f}  {short(f)}")

    if a.baseline:
        print("\nlargest differences in self instructions per request (this, baseline, difference)")
        diff = sorted(((self_cost.get(f, 0) / n - base_self.get(f, 0) / base_n, f)
                       for f in set(self_cost) | set(base_self)), reverse=True)[: a.top]
        for d, f in diff:
            print(f"{self_cost.get(f, 0) / n:9,.0f} {base_self.get(f, 0) / base_n:9,.0f} {d:+9,.0f}  {short(f, 120)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Draw docs/bench.png from the results of scripts/bench.sh (its LOG.tsv).

One column per scenario (allow, deny, many, h2), three rows: throughput (median req/s over the
rounds, bars from the slowest to the fastest round), p99 latency, and the CPU time the proxy
used per request (the steadiest of the three on a shared machine), each median with min-max.

usage: python3 scripts/bench_plot.py RESULTS.tsv [OUT.png]   (needs matplotlib: pip install matplotlib)
"""

import csv
import statistics
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TITLES = {
    "allow": "every request allowed\n(HTTP/1.1, wrk)",
    "deny": "nearly every request refused\n(429 path, wrk)",
    "many": "100,000 distinct clients\n(HTTP/1.1, wrk)",
    "h2": "HTTP/2 h2c\n(h2load)",
}


def colour(target):
    for prefix, c in [("direct", "#999999"), ("bare", "#4c72b0"), ("tollgate-memory", "#dd8452"),
                      ("tollgate-redis", "#c44e52"), ("nginx", "#55a868")]:
        if target.startswith(prefix):
            return c
    return "#8172b2"


def label(target):
    for suffix in ("-deny", "-many", "-h2"):
        target = target.removesuffix(suffix)
    return {"bare": "bare floor", "tollgate-memory": "tollgate\nmemory",
            "tollgate-redis": "tollgate\nRedis", "nginx": "nginx\nlimit_req"}.get(target, target)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[2] if len(sys.argv) == 3 else "docs/bench.png"
    data = OrderedDict()  # scenario -> target -> {"rps": [...], "p99": [...]}
    with open(sys.argv[1], newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            t = data.setdefault(row["scenario"], OrderedDict()).setdefault(row["target"], {"rps": [], "p99": [], "cpu": []})
            t["rps"].append(float(row["req_s"]))
            t["p99"].append(float(row["p99_us"]) / 1000)
            t["cpu"].append(float(row["cpu_us_per_req"]))
    fig, axes = plt.subplots(3, len(data), figsize=(3.4 * len(data), 9), squeeze=False)
    for col, (scenario, targets) in enumerate(data.items()):
        names = list(targets)
        x = range(len(names))
        for row, (metric, ylabel) in enumerate([("rps", "req/s (higher is better)"),
                                                ("p99", "p99 latency, ms"),
                                                ("cpu", "proxy CPU per request, µs\n(+ redis-server for Redis)")]):
            ax = axes[row][col]
            med = [statistics.median(targets[n][metric]) for n in names]
            err = [[m - min(targets[n][metric]) for m, n in zip(med, names)],
                   [max(targets[n][metric]) - m for m, n in zip(med, names)]]
            ax.bar(x, med, yerr=err, capsize=3, color=[colour(n) for n in names])
            ax.set_xticks(list(x), [label(n) for n in names], fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(axis="y", alpha=0.3)
            if row == 0:
                ax.set_title(TITLES.get(scenario, scenario), fontsize=9)
            if col == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    rounds = max(len(t["rps"]) for targets in data.values() for t in targets.values())
    fig.suptitle(f"scripts/bench.sh: proxy alone on CPU 0, backend + load generator on CPU 1; median of "
                 f"{rounds} interleaved rounds, bars min-max\n"
                 f"a shared, noisy 2-core VM: compare within a column, trust CPU per request most",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

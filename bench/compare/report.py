#!/usr/bin/env python3
"""results.jsonl -> a markdown table (ratios to the limits measured in the same run) and a PNG chart."""
import json
import sys

res_path, md_path, png_path = sys.argv[1:4]
raw = [json.loads(line) for line in open(res_path) if line.strip()]
# Keep each row's best run (rows are measured round-robin, several passes).
best = {}
for r in raw:
    key = (r["cache"], r["name"])
    cur = best.get(key)
    if cur is None or ("error" in cur and "error" not in r) or (
            "error" not in r and "error" not in cur and r["seconds"] < cur["seconds"]):
        best[key] = r
rows = list(best.values())
for r in rows:
    r["runs"] = sum(1 for x in raw if (x["cache"], x["name"]) == (r["cache"], r["name"]) and "error" not in x)
ok = [r for r in rows if "error" not in r]


def limit(cache):
    lims = [r["gbps"] for r in ok if r["cache"] == cache and r["kind"] == "limit"]
    return max(lims) if lims else None


lines = ["| cache | loader | GB/s | vs limit | vs best peer | peak RSS (MiB) |", "|---|---|---:|---:|---:|---:|"]
for cache in ("hot", "cold"):
    lim = limit(cache)
    peers = [r["gbps"] for r in ok if r["cache"] == cache and r["kind"] == "peer"]
    best_peer = max(peers) if peers else None
    for r in rows:
        if r["cache"] != cache:
            continue
        if "error" in r:
            lines.append(f"| {cache} | {r['name']} | failed: {r['error'][:60]} | | | |")
            continue
        stream = r.get("detail", "").startswith("stream")
        name = r["name"] + (f" ({r['detail'].split('(')[-1].rstrip(')')})" if stream else "")
        name += " (limit)" if r["kind"] == "limit" else ""
        vs_lim = f"{r['gbps'] / lim:.0%}" if lim and r["kind"] != "limit" else ""
        vs_peer = f"{r['gbps'] / best_peer:.2f}x" if best_peer and r["kind"] == "ours" else ""
        rss = f"{r['peak_rss'] / 2**20:.0f}" if r.get("peak_rss") else ""
        lines.append(f"| {cache} | {name} | {r['gbps']:.2f} | {vs_lim} | {vs_peer} | {rss} |")
note = ("\nHot: files in the page cache; limit = single-thread memcpy. Cold: `drop_caches` before each run; "
        "limit = the faster O_DIRECT sequential read. Best of the runs per row (round-robin passes). "
        "Peers keep owned copies (`clone()`), as weightlift does. "
        "Python peers' RSS includes the interpreter and torch (~230 MiB).\n")
open(md_path, "w").write("\n".join(lines) + "\n" + note)
print("\n".join(lines))

import matplotlib  # noqa: E402  (after the table: the chart is optional)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
for ax, cache in zip(axes, ("hot", "cold")):
    rs = [r for r in ok if r["cache"] == cache]
    if not rs:
        continue
    colors = {"limit": "#888888", "ours": "#1f77b4", "peer": "#ff7f0e"}
    ax.barh([r["name"] for r in rs], [r["gbps"] for r in rs], color=[colors[r["kind"]] for r in rs])
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (higher is better)")
    ax.set_title(f"{cache} page cache")
    for i, r in enumerate(rs):
        ax.text(r["gbps"], i, f" {r['gbps']:.2f}", va="center", fontsize=8)
fig.suptitle("weightlift load vs peers and machine limits (2 GB checkpoint, shared 2-core VM: noisy)")
fig.tight_layout()
fig.savefig(png_path, dpi=110)

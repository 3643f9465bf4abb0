#!/usr/bin/env python3
"""Turns one run's output (our summary line, a peer's or a limit's JSON) into a result row."""
import json
import re
import sys

cache, kind, name = sys.argv[1:4]
text = sys.stdin.read()
row = {"cache": cache, "kind": kind, "name": name}
m = re.search(r"loaded (\d+) tensors, (\d+) bytes from \d+ files in ([0-9.]+) s "
              r".*?strategy ([^,]+), peak RSS ([0-9.]+) MiB", text)
if m:
    row.update(tensors=int(m[1]), bytes=int(m[2]), seconds=float(m[3]), detail=m[4],
               peak_rss=float(m[5]) * 2**20)
else:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            row.update(seconds=d["seconds"], bytes=d["bytes"], peak_rss=d.get("peak_rss"), tensors=d.get("tensors"))
            break
    else:
        sys.exit(1)
row["gbps"] = row["bytes"] / row["seconds"] / 1e9 if row["seconds"] > 0 else 0.0
print(json.dumps(row))

#!/usr/bin/env python3
"""The longest Rust functions of the workspace, in lines from the `fn` line to its closing
brace (tests and benches left out).

    TOP=10 python3 scripts/fn_lengths.py . train,comm,lab,cli,launch
"""
import os, re, sys
root = sys.argv[1]
crates = sys.argv[2].split(",") if len(sys.argv) > 2 else None
rows = []
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)')
for dp, dn, fns in os.walk(os.path.join(root, "crates")):
    if "/target" in dp: continue
    for f in fns:
        if not f.endswith(".rs"): continue
        p = os.path.join(dp, f)
        rel = os.path.relpath(p, root)
        if crates and rel.split("/")[1] not in crates: continue
        if "/tests/" in rel or "/benches/" in rel: continue
        lines = open(p).read().split("\n")
        i = 0
        while i < len(lines):
            m = fn_re.match(lines[i])
            if m and not lines[i].strip().startswith("//"):
                # find the opening brace and match
                depth = 0; started = False; j = i
                while j < len(lines):
                    code = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
                    code = re.sub(r"'(\\.|[^'\\])'", "''", code)
                    code = code.split("//")[0]
                    if not started and ";" in code and "{" not in code:
                        break
                    for ch in code:
                        if ch == "{": depth += 1; started = True
                        elif ch == "}": depth -= 1
                    if started and depth == 0: break
                    j += 1
                if started:
                    rows.append((j - i + 1, f"{rel}:{i+1}", m.group(6)))
            i += 1
rows.sort(reverse=True)
n = int(os.environ.get("TOP", "10"))
for r in rows[:n]:
    print(f"{r[0]:5d}  {r[2]:30s} {r[1]}")

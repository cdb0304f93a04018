#!/usr/bin/env python3
"""Reads `go test -json` on stdin and prints what `go test` without -v
would: each package's result line, and the whole output of every test
that fails (of its subtests too). It ends with the ten slowest tests
(top-level and subtests) and the five slowest packages."""
import json
import sys

def own_errors(lines):
    """The lines a failing test wrote itself (t.Errorf, t.Fatalf: they
    start with FILE_test.go:LINE:), each cut to its first few lines, so
    the reason for a failure can be read without the process logs the
    test printed beside it."""
    keep = set()
    for i, l in enumerate(lines):
        if l.lstrip().split(":", 1)[0].endswith("_test.go"):
            keep.update(range(i, min(i + 4, len(lines))))
    picked = [lines[i] for i in sorted(keep)]
    return [l[:300] + ("\n" if len(l) > 300 else "") for l in picked[:24]]


out = {}  # (package, test) -> output lines, until the test ends
elapsed, packages = [], []
reasons = []  # (package, test, the test's own error lines)
for line in sys.stdin:
    try:
        ev = json.loads(line)
    except ValueError:
        sys.stdout.write(line)
        continue
    pkg, test, action = ev.get("Package", ""), ev.get("Test"), ev.get("Action")
    if action == "output":
        if test:
            out.setdefault((pkg, test), []).append(ev.get("Output", ""))
        else:
            sys.stdout.write(ev.get("Output", ""))
    elif action in ("pass", "fail", "skip") and test:
        lines = out.pop((pkg, test), [])
        if action == "fail":
            sys.stdout.write("".join(lines))
            reasons.append((pkg, test, own_errors(lines)))
        if action != "skip" and "Elapsed" in ev:
            elapsed.append((ev["Elapsed"], pkg, test, action))
    elif action in ("pass", "fail") and "Elapsed" in ev:
        packages.append((ev["Elapsed"], pkg, action))
    sys.stdout.flush()
for (pkg, test), lines in out.items():  # a test that never ended: a crash or timeout
    sys.stdout.write(f"--- {pkg} {test} did not end:\n" + "".join(lines[-200:]))

short = lambda p: p.removeprefix("github.com/scellis/scellis/")
print("\n== the ten slowest tests")
for e, pkg, test, action in sorted(elapsed, reverse=True)[:10]:
    print(f"{e:8.1f} s  {short(pkg)} {test}" + (" (failed)" if action == "fail" else ""))
print("== the five slowest packages")
for e, pkg, action in sorted(packages, reverse=True)[:5]:
    print(f"{e:8.1f} s  {short(pkg)}" + (" (failed)" if action == "fail" else ""))
# Last, so that a log cut to its tail still says why: each failing test
# and the errors it reported itself.
if reasons:
    print("== why the failing tests failed")
    for pkg, test, lines in reasons:
        print(f"--- {short(pkg)} {test}")
        sys.stdout.write("".join(lines) or "    (no error line of its own: see its output above)\n")

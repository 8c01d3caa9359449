"""Counts of numba-cuda test runs (``python -m numba.runtests`` logs) as one table,
and the failing or erroring tests each run has beyond the first (the baseline).
Usage: python3 suite_table.py LOG_DIR BASELINE LABEL... (reads LOG_DIR/suite_<label>.log)
"""
import pathlib
import re
import sys

RAN = re.compile(r"^Ran (\d+) tests? in ([\d.]+)s")
RESULT = re.compile(r"^(OK|FAILED)(?: \((.*)\))?\s*$")
PROBLEM = re.compile(r"^(FAIL|ERROR): (\S+) \(([^)]*)\)")


def summarize(log: pathlib.Path):
    """(counts, problem test ids) of one log; counts are None when it has no result."""
    if not log.is_file():
        return None, set()
    ran = seconds = None
    parts = {}
    problems = set()
    for line in log.read_text(errors="replace").splitlines():
        m = RAN.match(line)
        if m:
            ran, seconds = int(m.group(1)), float(m.group(2))
        m = RESULT.match(line)
        if m and ran is not None:
            parts = dict(p.strip().split("=") for p in (m.group(2) or "").split(",") if "=" in p)
        m = PROBLEM.match(line)
        if m:
            kind, name, where = m.groups()
            # Python 3.11+ writes "name (module.Class.name)", older ones "name (module.Class)".
            full = where if where.endswith("." + name) else f"{where}.{name}"
            problems.add(f"{kind}: {full}")
    if ran is None:
        return None, problems
    counts = {k: int(parts.get(k, 0)) for k in ("failures", "errors", "skipped", "expected failures",
                                                "unexpected successes")}
    counts["ran"], counts["seconds"] = ran, seconds
    counts["passed"] = ran - counts["failures"] - counts["errors"] - counts["skipped"] \
        - counts["expected failures"] - counts["unexpected successes"]
    return counts, problems


def main() -> int:
    out, labels = pathlib.Path(sys.argv[1]), sys.argv[2:]
    results = {label: summarize(out / f"suite_{label}.log") for label in labels}
    print(f"{'run':16} {'tests':>6} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} {'seconds':>8}")
    for label, (c, _) in results.items():
        if c is None:
            print(f"{label:16} no result line (see suite_{label}.log)")
            continue
        print(f"{label:16} {c['ran']:>6} {c['passed']:>7} {c['failures']:>7} {c['errors']:>7} "
              f"{c['skipped']:>8} {c['seconds']:>8.1f}")
    base = labels[0]
    worse = False
    for label in labels[1:]:
        extra = sorted(results[label][1] - results[base][1])
        fixed = sorted(results[base][1] - results[label][1])
        print(f"== only with {label} (beyond {base}): {len(extra)}")
        for t in extra:
            print(f"   {t}")
        if fixed:
            print(f"== only with {base} (not with {label}): {len(fixed)}")
            for t in fixed:
                print(f"   {t}")
        worse |= bool(extra) or results[label][0] is None
    return 1 if worse or results[base][0] is None else 0


if __name__ == "__main__":
    sys.exit(main())

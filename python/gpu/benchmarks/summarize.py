"""Summarizes benchmark lines ('<variant> size=<bytes> us_per_pair=<us>') from
several interleaved rounds: per variant and size, the median over rounds and the
range. Usage: python3 summarize.py < py_bench.txt"""
import collections
import re
import statistics
import sys

LINE = re.compile(r"^(\S+) size=(\d+) us_per_pair=([\d.]+)$")


def main():
    runs = collections.defaultdict(list)
    variants = []  # in order of first appearance
    for line in sys.stdin:
        m = LINE.match(line.strip())
        if not m:
            continue
        key = (m.group(1), int(m.group(2)))
        if key[0] not in variants:
            variants.append(key[0])
        runs[key].append(float(m.group(3)))
    print(f"{'variant':32} {'size':>9} {'rounds':>6} {'median':>8} {'min':>8} {'max':>8}")
    for key in sorted(runs, key=lambda k: (variants.index(k[0]), k[1])):
        v = runs[key]
        print(f"{key[0]:32} {key[1]:>9} {len(v):>6} {statistics.median(v):>8.2f} {min(v):>8.2f} {max(v):>8.2f}")


if __name__ == "__main__":
    main()

"""Step times with the host's speed taken out by a fit, for train_rounds.py.

The lent machine's host slows by up to 2x for stretches of seconds to minutes,
and with a new shape every step a step waits on the host's planning, so a
process that ran on a slow stretch shows a slower median whatever its allocator.
train_bench.py times a fixed ~1 ms Python loop just before each timed step (the
host probe) and draws the same shapes at the same step index in every process.
So every timed step of every process enters one least-squares fit:

    log(step ms) = a[step index] + g[process] + b * log(probe ms) + error

`a` takes what the shapes cost, `b` how much of a step moves with the host, and
`g` what is left to the process: its allocator and whatever of its host's
slowness the probe did not see. Differences of `g` are what the fit compares:
exp(g[p] - g[q]) is how much slower p's steps ran than q's at the same shapes
and host speed. No numpy (the host tests and `--from-log` run without it): the
two sets of effects are taken out by alternating demeaning (the
Frisch-Waugh-Lovell way), which is exact in one sweep when every process timed
every index. Where processes timed different indices, differences of `g` mean
something only when every process shares step indices, directly or through
others, with every other (a connected panel), and the sweeps take longer: a
panel that is not connected, or that has not settled after SWEEPS sweeps, gives
no fit.
"""
import math

SWEEPS = 500
TOLERANCE = 1e-12


class Fit:
    """What `fit` found: `slope` (b), `effects` (g per process key, in log space,
    their mean 0), `steps` (the steps that entered)."""

    def __init__(self, slope, effects, steps):
        self.slope = slope
        self.effects = effects
        self.steps = steps

    def ratio(self, p, q):
        """How much slower process p's steps ran than q's, host speed and shapes
        equal."""
        return math.exp(self.effects[p] - self.effects[q])


def fit(processes):
    """`processes`: {key: (step_ms list, probe_ms list)}, the lists of a process
    index by index. Steps with a missing, zero or negative time or probe are left
    out. Returns a Fit, or None where there is nothing to compare: fewer than two
    processes with steps, processes that share no step index (directly or through
    others), probes that never vary once the effects are out, or sweeps that did
    not settle."""
    rows = []  # (index, process key, log step, log probe)
    for key, (steps, probes) in processes.items():
        for i, (t, p) in enumerate(zip(steps, probes)):
            if t and p and t > 0 and p > 0:
                rows.append((i, key, math.log(t), math.log(p)))
    if len({r[1] for r in rows}) < 2 or not _connected(rows):
        return None
    y = [r[2] for r in rows]
    x = [r[3] for r in rows]
    ey, ex = _effects(rows, y), _effects(rows, x)
    if ey is None or ex is None:
        return None
    yt, xt = _residual(rows, y, ey), _residual(rows, x, ex)
    sxx = sum(v * v for v in xt)
    if sxx <= 1e-18:
        return None
    slope = sum(a * b for a, b in zip(xt, yt)) / sxx
    # The effects are linear in what they are fitted to: those of log step less
    # slope x log probe are the step's less slope x the probe's.
    g = {k: ey[1][k] - slope * ex[1][k] for k in ey[1]}
    mean = sum(g.values()) / len(g)
    return Fit(slope, {k: v - mean for k, v in g.items()}, len(rows))


def _connected(rows):
    """Whether every process reaches every other through the step indices they
    share (processes and indices as the two sides of one graph)."""
    parent = {}

    def root(n):
        while parent.setdefault(n, n) != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for r in rows:
        parent[root(("p", r[1]))] = root(("i", r[0]))
    return len({root(("p", r[1])) for r in rows}) == 1


def _residual(rows, values, effects):
    """`values` with the index and process `effects` taken out (the residual of a
    fit on both sets of dummies)."""
    a, g = effects
    return [v - a[r[0]] - g[r[1]] for r, v in zip(rows, values)]


def _effects(rows, values):
    """The index effects and process effects of `values` (least squares, the two
    sets fitted together by alternating means); None where SWEEPS sweeps did not
    settle them."""
    a = {r[0]: 0.0 for r in rows}
    g = {r[1]: 0.0 for r in rows}
    for _ in range(SWEEPS):
        a = _means(rows, values, g, index=0, other=1)
        g_new = _means(rows, values, a, index=1, other=0)
        moved = max(abs(g_new[k] - g[k]) for k in g)
        g = g_new
        if moved < TOLERANCE:
            return a, g
    return None


def _means(rows, values, other_effects, index, other):
    sums, counts = {}, {}
    for r, v in zip(rows, values):
        k = r[index]
        sums[k] = sums.get(k, 0.0) + v - other_effects[r[other]]
        counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}

"""The nodes' health as the node probe measured it (jobs/nodeprobe.py): verdicts, the ledger, the trend.

**Verdicts.** Per figure (contract/health.py: compute, copy, the worker's step; the ring's pairs'
bus bandwidth), each node's repeated timings are tested against the *others'* (leave one out), taken
``margin`` lower (10% by default): a one-sided Mann-Whitney rank-sum test (exact for small samples) of
"this node's values lie below the fleet's by more than the margin". Ranks, not means: one wild timing
of a loaded machine cannot make or hide a verdict. The tests of one probe (every node's every
figure, every pair) form one family, judged with Holm's step-down at ``alpha`` (5%, the findings'
level, launcher/report/sequential.py): where the nodes' repeats are exchangeable (a healthy fleet,
differences within the margin), a probe flags anything at all with probability at most 5%. A node
flagged is left out of the others and the rest judged again (a second slow node must not hide in
the first's spread). Fewer than three nodes: no verdict.

**Pairs.** A pair is held against the pairs that share no node with it (where there are two or more:
five nodes or more), so that a slow node's two pairs do not hide each other. A slow pair is put on a node when one of its nodes is slow in its own figures; on a node's
network when both of a node's pairs are slow and its own figures are not; otherwise on the link.

**The ledger**: launcher/report/healthledger.py.
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract import records
from contract.health import NODE_FIGURES, PAIR_FIGURE
from launcher.report.healthledger import append as append
from launcher.report.healthledger import history_dir as history_dir
from launcher.report.healthledger import ledger_path as ledger_path
from launcher.report.healthledger import read as read
from launcher.report.sequential import ALPHA

MARGIN = 0.10  # a node is called slow only beyond 10% below the fleet (identical GPUs differ by ~8%)
MIN_NODES = 3  # a node against at least two others: a spread between nodes to judge it by


@dataclass
class Test:
    """One node's (or pair's) figure against the others."""

    unit: str  # a node's name, or "nodeA-nodeB" for a pair
    figure: str
    value: float  # the geometric mean of its repeats
    ratio: float  # to the others' geometric mean
    p: float  # one-sided: "slower than the others by more than the margin"
    slow: bool = False


@dataclass
class Verdicts:
    tests: list[Test]
    slow_nodes: dict[str, list[str]]  # node -> why (figure: ratio)
    slow_links: dict[str, str]  # "a-b" -> whose fault and why
    margin: float
    alpha: float
    judged: bool  # False: too few nodes for a verdict
    note: str = ""
    dcgm_failed: dict[str, str] = field(default_factory=dict)
    networks: list[str] = field(default_factory=list)  # nodes both of whose pairs are slow

    @property
    def flagged(self) -> list[str]:
        """The nodes to keep out: slow in their own figures, a slow network, or failed by DCGM."""
        return sorted({*self.slow_nodes, *self.dcgm_failed, *self.networks})


def _log_mean(values: Sequence[float]) -> float:
    return statistics.fmean(math.log(v) for v in values)


# The exact distribution costs m x (m n) steps: beyond this, the normal approximation of U (whose far
# tail is too thin to judge a thousand nodes' tests at Holm's levels, so the exact one goes far).
EXACT_UP_TO = 5_000_000


def rank_sum_p(slow: Sequence[float], others: Sequence[float]) -> float:
    """One-sided Mann-Whitney U: the p-value of "``slow``'s values lie below ``others``'" (U counts the
    pairs with x < y, ties as half). Exact (no ties assumed) up to EXACT_UP_TO pairs, else normal."""
    m, n = len(slow), len(others)
    if not m or not n:
        return 1.0
    u = sum(1.0 if x < y else 0.5 if x == y else 0.0 for x in slow for y in others)
    if m * m * n > EXACT_UP_TO:
        mean, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
        return 1 - statistics.NormalDist().cdf((u - 0.5 - mean) / sd)
    counts = _u_counts(m, n)
    total = sum(counts)
    return sum(counts[math.ceil(u - 1e-9):]) / total


@functools.lru_cache(maxsize=256)
def _u_counts(m: int, n: int) -> tuple[float, ...]:
    """The number of orderings of m x's among n y's with each U = 0..mn: the coefficients of the
    Gaussian binomial [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)."""
    poly = [1.0] + [0.0] * (m * n)
    for i in range(1, m + 1):
        for k in range(len(poly) - 1, n + i - 1, -1):  # times (1 - q^(n+i))
            poly[k] -= poly[k - n - i]
        for k in range(i, len(poly)):  # over (1 - q^i): a running sum with stride i
            poly[k] += poly[k - i]
    return tuple(max(0.0, c) for c in poly)


def judge_units(units: dict[str, list[float]], figure: str, margin: float, exclude: frozenset[str] | set[str] = frozenset()
                ) -> list[Test]:
    """Every unit's repeats against the others' (leave one out, units in ``exclude`` not among them),
    the others' taken ``margin`` lower: a unit is tested for lying below the fleet by more than the margin."""
    usable = {u: [x for x in v if x > 0] for u, v in units.items()}
    usable = {u: v for u, v in usable.items() if v}
    tests = []
    for unit, mine in usable.items():
        peers = [u for u in usable if u != unit and u not in exclude]
        # A pair is held against the pairs of other nodes where there are enough: its neighbours share
        # a node with it, and a slow node (or NIC) would slow them too and hide it.
        apart = [u for u in peers if not set(u.split("-")) & set(unit.split("-"))] if figure == PAIR_FIGURE else []
        peers = apart if len(apart) >= MIN_NODES - 1 else peers
        if len(peers) < MIN_NODES - 1:
            continue
        others = [x for u in peers for x in usable[u]]
        centre = statistics.fmean(_log_mean(usable[u]) for u in peers)
        tests.append(Test(unit, figure, math.exp(_log_mean(mine)), math.exp(_log_mean(mine) - centre),
                          rank_sum_p(mine, [x * (1 - margin) for x in others])))
    return tests


def holm(tests: Sequence[Test], alpha: float) -> None:
    """Holm's step-down over ``tests``: the smallest p against alpha/m, the next against alpha/(m-1), ..."""
    ordered = sorted(tests, key=lambda t: t.p)
    for i, test in enumerate(ordered):
        if test.p > alpha / (len(ordered) - i):
            break
        test.slow = True


def judge(result: dict[str, Any], margin: float = MARGIN, alpha: float = ALPHA) -> Verdicts:
    """The probe's verdicts (module docstring): slow nodes, slow pairs named by whose fault they are."""
    nodes = {n["host"]: n for n in result["nodes"]}
    names = [n["host"] for n in result["nodes"]]
    dcgm_failed = {h: n["dcgm"].get("reason") or "dcgmi diag -r 1 failed" for h, n in nodes.items()
                   if n.get("dcgm", {}).get("verdict") == "fail"}
    if len(names) < MIN_NODES:
        return Verdicts([], {}, {}, margin, alpha, False,
                        f"{len(names)} node(s): a verdict needs {MIN_NODES} or more (a node against the spread of "
                        f"at least two others)", dcgm_failed)
    pairs = {f"{names[a]}-{names[b]}": p["busbw_gb_per_s"] for p in result["pairs"] for a, b in [p["pair"]]}
    excluded: set[str] = set()
    while True:
        tests = [t for figure in NODE_FIGURES
                 for t in judge_units({h: n["figures"].get(figure, []) for h, n in nodes.items()}, figure, margin,
                                      excluded)]
        tests += judge_units(pairs, PAIR_FIGURE, margin, {p for p in pairs if set(p.split("-")) & excluded})
        holm(tests, alpha)
        slow = {t.unit for t in tests if t.slow and t.figure != PAIR_FIGURE}
        if slow <= excluded:
            break
        excluded |= slow
    note = ""
    repeats = min((len(v) for n in nodes.values() for v in n["figures"].values() if v), default=0)
    if tests and repeats and 1 / math.comb(repeats * len(names), repeats) > alpha / len(tests):
        note = (f"{repeats} repeats per node are too few for any verdict among {len(names)} nodes at this level "
                f"(the smallest p-value they allow, 1/{math.comb(repeats * len(names), repeats)}, is above "
                f"{alpha:.0%}/{len(tests)} tests): set health.repeats higher")
    slow_nodes: dict[str, list[str]] = {}
    for t in tests:
        if t.slow and t.figure != PAIR_FIGURE:
            slow_nodes.setdefault(t.unit, []).append(f"{t.figure} {t.ratio:.2f}x the others")
    slow_pairs = [t for t in tests if t.slow and t.figure == PAIR_FIGURE]
    in_slow_pairs: dict[str, int] = {}
    for t in slow_pairs:
        for node in t.unit.split("-"):
            in_slow_pairs[node] = in_slow_pairs.get(node, 0) + 1
    links, networks = {}, set()
    for t in slow_pairs:
        a, b = t.unit.split("-")
        why = f"busbw {t.ratio:.2f}x the other pairs"
        if a in slow_nodes or b in slow_nodes:
            links[t.unit] = f"node {a if a in slow_nodes else b} is slow in its own figures ({why})"
        elif in_slow_pairs[a] > 1 or in_slow_pairs[b] > 1:
            node = a if in_slow_pairs[a] > 1 else b
            networks.add(node)
            links[t.unit] = f"{node}'s network: both of its pairs are slow, its own figures are not ({why})"
        else:
            links[t.unit] = f"the link between {a} and {b}: both nodes compute normally ({why})"
    return Verdicts(tests, slow_nodes, links, margin, alpha, True, note, dcgm_failed, sorted(networks))


def false_alarm_text(v: Verdicts) -> str:
    n = len({t.unit for t in v.tests if t.figure != PAIR_FIGURE})
    return (f"{len(v.tests)} rank-sum tests ({n} nodes x {len(NODE_FIGURES)} figures and the ring's pairs), Holm "
            f"at {v.alpha:.0%} in all: a probe of a healthy cluster flags anything with probability at most "
            f"{v.alpha:.0%}; a node is slow only beyond {v.margin:.0%} below the others")


# ---- the ledger (launcher/report/healthledger.py) ----------------------------------------------------

def record(cluster_key: str, result: dict[str, Any], verdicts: Verdicts, asked: dict[str, Any]) -> dict[str, Any]:
    """One ledger line: each node's figures (geometric means and repeats), the pairs, the verdicts."""
    names = [n["host"] for n in result["nodes"]]
    return {"cluster": cluster_key, "measured_at": result["measured_at"], "asked": asked,
            "nodes": {n["host"]: {"figures": {f: _geo(v) for f, v in n["figures"].items()}, "repeats": n["figures"],
                                  "dcgm": {k: v for k, v in n.get("dcgm", {}).items() if k != "output"},
                                  "cgroup_cpus": (n.get("cores") or {}).get("cgroup_cpus")}
                      for n in result["nodes"]},
            "pairs": {f"{names[p['pair'][0]]}-{names[p['pair'][1]]}": _geo(p["busbw_gb_per_s"]) for p in result["pairs"]},
            "verdicts": {"judged": verdicts.judged, "note": verdicts.note, "slow_nodes": verdicts.slow_nodes,
                         "slow_links": verdicts.slow_links, "dcgm_failed": verdicts.dcgm_failed,
                         "flagged": verdicts.flagged, "margin": verdicts.margin, "alpha": verdicts.alpha,
                         "tests": [asdict(t) for t in verdicts.tests]},
            "cost": {"node_s": result["node_s"], "pairs_s": result["pairs_s"], "job_s": result["job_s"],
                     "in_turn": result["in_turn"]}}


def _geo(values: Sequence[float]) -> float | None:
    good = [v for v in values if v > 0]
    return math.exp(_log_mean(good)) if good else None


# ---- what --show prints ------------------------------------------------------------------------------

def ratios(rec: dict[str, Any], figure: str) -> dict[str, float]:
    """Each node's figure over the median of the nodes' in one ledger record."""
    values = {h: n["figures"].get(figure) for h, n in rec["nodes"].items()}
    values = {h: v for h, v in values.items() if v}
    if not values:
        return {}
    centre = statistics.median(values.values())
    return {h: v / centre for h, v in values.items()}


def show(records: Sequence[dict[str, Any]], last: int = 6) -> list[str]:
    """Each node's latest figures, its trend (its figures over the fleet's median in the last probes,
    oldest first) and its latest verdict."""
    if not records:
        return ["no probe in this ledger yet: run python -m launcher.health"]
    latest = records[-1]
    recent = list(records[-last:])
    flagged = set(latest["verdicts"]["flagged"])
    lines = [f"{len(records)} probe(s); the latest {latest['measured_at']}, "
             f"{len(latest['nodes'])} node(s)" + (f" ({latest['verdicts']['note']})" if latest['verdicts']['note'] else ""),
             "", "| node | " + " | ".join(NODE_FIGURES) + " | trend: matmul / fleet median, last probes | "
             "slow in | verdict |", "|---|" + "---:|" * len(NODE_FIGURES) + "---|---:|---|"]
    for host, node in latest["nodes"].items():
        figures = " | ".join(f"{node['figures'].get(f) or 0:.3g}" for f in NODE_FIGURES)
        trend = " ".join(f"{ratios(r, 'matmul_gflops').get(host, float('nan')):.2f}" for r in recent)
        slow_in = sum(host in r["verdicts"]["flagged"] for r in recent)
        why = latest["verdicts"]["slow_nodes"].get(host) or [latest["verdicts"]["dcgm_failed"].get(host, "")]
        verdict = ("slow: " + "; ".join(w for w in why if w)) if host in flagged else "ok"
        lines.append(f"| {host} | {figures} | {trend} | {slow_in} of {len(recent)} | {verdict} |")
    for link, why in latest["verdicts"]["slow_links"].items():
        lines.append(f"- pair {link}: {why}")
    return lines


def drain_lines(verdicts: Verdicts) -> list[str]:
    """The scontrol lines that would drain the flagged nodes (printed for an operator, never run)."""
    out = []
    for node in verdicts.flagged:
        why = "; ".join(verdicts.slow_nodes.get(node, [])) or verdicts.dcgm_failed.get(node) or "its network is slow"
        reason = re.sub(r"[^A-Za-z0-9 .:;,_/x-]", "", f"launcher.health: {why}")[:100]
        out.append(f"scontrol update nodename={node} state=drain reason=\"{reason}\"")
    return out


# ---- a sweep's report (health=auto) ---------------------------------------------------------------

SWEEP_FILE = "health.json"  # what health=auto found before the sweep's cells, in the sweep directory
PLOTS_DIR = "plots"  # the report's plots folder (launcher/report/markdown.py), attached to the parent run


def keep_in_sweep(sweep_dir: Path, notes: dict[str, Any]) -> None:
    """What health=auto found, in the sweep directory (health.json), with each probe's trend plot
    copied among the report's plots (plots/health-<pool>.png, the pool its backend's settings name:
    shown in the report, attached with the others to the sweep's parent run)."""
    import shutil

    for p in notes.get("probes", []):
        trend = Path(p.pop("trend", "") or "")
        where = re.sub(r'[^A-Za-z0-9_.-]+', '_', _pool(p) or 'default')
        # the ledger's history (python -m launcher.history --ledger), where one was written
        past = history_dir(Path(p["ledger"])) / "history.png" if p.get("ledger") else None
        for key, source, name in (("plot", trend, f"{PLOTS_DIR}/health-{where}.png"),
                                  ("history", past, f"{PLOTS_DIR}/health-history-{where}.png")):
            if source is not None and source.is_file():
                (Path(sweep_dir) / PLOTS_DIR).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, Path(sweep_dir) / name)
                p[key] = name
    records.write_document(Path(sweep_dir) / SWEEP_FILE, notes)


def _pool(probe: dict[str, Any]) -> str | None:
    """The pool a probe of a sweep's health.json covered (``partition`` in sweeps from before ``pool``)."""
    return probe["pool"] if "pool" in probe else probe.get("partition")


def sweep_plots(sweep_dir: Path) -> list[Path]:
    """The trend plots (and the ledger's history plots) health=auto copied among a sweep's plots."""
    return sorted((Path(sweep_dir) / PLOTS_DIR).glob("health-*.png"))


def section(sweep_dir: Path) -> list[str]:
    """The report's *Node health* section: what the probe before the cells found and kept out."""
    notes = records.maybe_document(Path(sweep_dir) / SWEEP_FILE, "what health=auto found")
    if notes is None:
        return []
    lines = ["## Node health", "", "`health=auto`: the nodes were probed before the cells (`python -m launcher.health`, "
             "docs/health.md)."]
    for p in notes.get("probes", []):
        where = p.get("where") or f"partition {_pool(p) or '(default)'}"  # a sweep from before "where": Slurm's
        if p.get("error"):
            lines.append(f"- {where}: the probe failed ({p['error']}); no node was excluded.")
            continue
        if not p.get("judged", True):
            lines.append(f"- {where}: no verdict ({p.get('note')}); no node was excluded.")
        elif p["excluded"]:
            why = "; ".join(f"{n}: {', '.join(w for w in p['why'][n] if w)}" for n in p["excluded"])
            lines.append(f"- {where}: **excluded {', '.join(p['excluded'])}** (cluster.exclude) after the probe of "
                         f"{p['measured_at']} judged {'it' if len(p['excluded']) == 1 else 'them'} slow ({why}); "
                         f"the cells ran without {'it' if len(p['excluded']) == 1 else 'them'}.")
        else:
            lines.append(f"- {where}: the probe of {p['measured_at']} flagged no node; every node could run cells.")
        if p.get("back"):
            lines.append(f"- back after a clean probe: {', '.join(p['back'])} (excluded by the previous probe).")
        lines.append(f"  Ledger: `{p['ledger']}`" + (f"; MLflow run `{p['run_id']}`." if p.get("run_id") else "."))
        if p.get("history"):
            lines.append(f"  Its history and change points ([plot]({p['history']}); the report: "
                         f"`{history_dir(Path(p['ledger'])) / 'report.md'}`, also on the latest probe's MLflow run "
                         f"under history/), as of the last `python -m launcher.history --ledger {p['ledger']}`.")
        else:
            lines.append(f"  Its history and change points: `python -m launcher.history --ledger {p['ledger']}`.")
        if p.get("plot"):
            lines += ["", f"![each node against the fleet, probe by probe]({p['plot']})"]
    return [*lines, ""]


def trend_plot(records: Sequence[dict[str, Any]], out: Path) -> Path | None:
    """Each node's figures over the fleet's median, probe by probe (one panel per figure), as a PNG:
    the ledger's trend at a glance. None when the ledger holds no probe."""
    if not records:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(4.2 * len(NODE_FIGURES), 3.4), dpi=90, layout="constrained")
    FigureCanvasAgg(fig)  # no pyplot: no global figure state, no GUI backend
    axes = fig.subplots(1, len(NODE_FIGURES), squeeze=False)[0]
    hosts = list(dict.fromkeys(h for r in records for h in r["nodes"]))
    for ax, figure in zip(axes, NODE_FIGURES, strict=True):
        for host in hosts:
            points = [(i, ratios(r, figure).get(host)) for i, r in enumerate(records)]
            xs = [i for i, v in points if v]
            ax.plot(xs, [v for _, v in points if v], marker="o", label=host)
            flagged = [i for i in xs if host in records[i]["verdicts"]["flagged"]]
            ax.scatter(flagged, [ratios(records[i], figure)[host] for i in flagged], s=90, facecolors="none",
                       edgecolors="red")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(figure, fontsize=9)
        ax.set_xlabel("probe (oldest first)")
        ax.set_ylabel("node / fleet median")
    axes[0].legend(fontsize=7)
    fig.suptitle("node health: each node against the fleet (red rings: flagged)", fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return out

"""``python -m launcher.health [key=value ...]``: probe every node of a partition or a node list, judge
them, keep the probe in the cluster's ledger and MLflow (docs/health.md).

    python -m launcher.health cluster=slurm cluster.partition=debug          # probe, judge, keep
    python -m launcher.health cluster=slurm cluster.partition=debug --show   # the ledger: latest, trend, verdict
    python -m launcher.health cluster=slurm cluster.partition=debug --check node3   # exit 1 when node3 is flagged
    python -m launcher.health --plan cluster=slurm cluster.declared=true health.nodes=1000

Exit status: 0 when nothing is flagged, 1 when a node or a link is, 2 on a mistake. ``--check NODE``
reads the ledger only (no job): 0 when NODE's latest probe flagged nothing of it, 1 when it did, so it
fits Slurm's HealthCheckProgram (a non-zero exit drains the node) as an NHC-style check.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.cli import USER_ERROR_EXIT, guarded
from launcher.healthprobe import NODES_PER_JOB, Asked, cluster_key, plan_cost, run, said
from launcher.plan.clusterschema import known_backend, settings_class
from launcher.report import health

KEYS = {"cluster": "a backend's name (launcher/cluster/registry.py)", "cluster.partition": "a partition", "cluster.nodelist": "nodes, e.g. node[1-4]",
        "cluster.exclude": "nodes left out", "cluster.gpus_per_node": "GPUs per node (0: CPU)",
        "cluster.timeout_min": "the job's time limit", "cluster.python": "the nodes' interpreter",
        "cluster.declared": "true: --plan against health.nodes declared nodes", "output_root": "where the ledger is",
        "tracking.uri": "the MLflow store (default: <output_root>/mlflow.db)", "tracking.enabled": "false: no MLflow",
        "health.repeats": "timings per figure and node", "health.margin": "how far below the fleet a node may be",
        "health.nodes": "nodes emulated on this machine (local), or declared (--plan)",
        "health.nodes_per_job": "the most nodes one job holds", "health.dcgm": "false: no dcgmi diag"}


def parse(args: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(settings, flags) from ``key=value`` words and ``--flag [value]``; an unknown key is an error."""
    settings, flags, i = {}, {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            takes = arg in ("--check", "--last")
            flags[arg] = args[i + 1] if takes and i + 1 < len(args) else ""
            i += 2 if takes else 1
            continue
        key, eq, value = arg.partition("=")
        if not eq or key not in KEYS:
            close = [k for k in KEYS if k.split(".")[-1] == key.split(".")[-1]]
            raise ValueError(f"{arg!r} is not a setting of launcher.health" + (f" (did you mean {close[0]}?)" if close
                             else f"; the settings: {', '.join(KEYS)}"))
        settings[key] = value
        i += 1
    return settings, flags


def asked_from(settings: dict[str, str]) -> Asked:
    cluster = settings_class(known_backend(settings.get("cluster", "local")))(partition=settings.get("cluster.partition"),
                            nodelist=settings.get("cluster.nodelist"), exclude=settings.get("cluster.exclude"),
                            gpus_per_node=int(settings.get("cluster.gpus_per_node", 0)),
                            timeout_min=int(settings.get("cluster.timeout_min", 15)),
                            python=settings.get("cluster.python"),
                            declared=settings.get("cluster.declared", "false").lower() == "true")
    root = Path(settings.get("output_root", "outputs"))
    tracking = settings.get("tracking.enabled", "true").lower() != "false"
    uri = settings.get("tracking.uri") or (f"sqlite:///{(root / 'mlflow.db').resolve()}" if tracking else None)
    margin = float(settings.get("health.margin", health.MARGIN))
    if not 0 <= margin < 1:
        raise ValueError(f"health.margin={margin}: a share below 1, e.g. health.margin=0.1 (10% below the fleet)")
    return Asked(cluster, root, emulated_nodes=int(settings.get("health.nodes", 1 if not cluster.declared else 0)),
                 repeats=int(settings.get("health.repeats", 5)), margin=margin, tracking_uri=uri if tracking else None,
                 nodes_per_job=int(settings.get("health.nodes_per_job", NODES_PER_JOB)),
                 dcgm=settings.get("health.dcgm", "true").lower() != "false")


def plan_lines(asked: Asked) -> list[str]:
    """What a probe of the declared nodes would cost (no job, no cluster asked)."""
    n = asked.emulated_nodes
    if n < 1:
        raise ValueError("--plan with cluster.declared=true needs health.nodes=N, the nodes to probe")
    c = plan_cost(n, asked.nodes_per_job, in_turn=False)
    return [f"a health probe of {n} declared node(s) (nothing submitted):",
            f"  jobs: {c['jobs']} (at most {asked.nodes_per_job} nodes each, one task per node; each job its own ring)",
            f"  pairs: {c['pairs']} (a ring per job: as many pairs as nodes, not n(n-1)/2 = {n * (n - 1) // 2}), "
            f"timed in {c['rounds']} rounds in which no node is in two pairs",
            f"  wall time: about {c['wall_s'] / 60:.1f} min ({c['jobs']} job(s) one after another, each about "
            f"{c['wall_s'] / c['jobs']:.0f} s: start-up and {c['measured_s']:.0f} s of measurements), the nodes "
            f"measuring at once",
            f"  verdicts: {n * 3 + c['pairs']} tests, Holm at 5% in all"]


@guarded
def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    try:
        settings, flags = parse(args)
        asked = asked_from(settings)
        if "--plan" in flags:
            print("\n".join(plan_lines(asked)))
            return 0
    except ValueError as exc:
        print(f"error: {str(exc).rstrip('.')}. Nothing was probed.", file=sys.stderr)
        return USER_ERROR_EXIT
    if asked.cluster.declared:
        print("error: cluster.declared=true describes nodes that are not there: use it with --plan",
              file=sys.stderr)
        return USER_ERROR_EXIT
    ledger = health.ledger_path(asked.output_root, cluster_key(asked.cluster))
    if "--show" in flags:
        records = health.read(ledger)
        last = int(flags.get("--last") or 6)
        print("\n".join(health.show(records, last)))
        plot = health.trend_plot(records[-last:], ledger.with_suffix(".png"))
        if plot is not None:
            print(f"trend plot: {plot}")
        return 0
    if "--check" in flags:
        return check(ledger, flags["--check"])
    try:
        probed = run(asked)
    except RuntimeError as exc:  # nothing measured: no node, or every job failed (each one's reason said)
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    print("\n".join(said(probed)), flush=True)
    return 1 if probed.verdicts.flagged or probed.verdicts.slow_links else 0


def check(ledger: Path, node: str) -> int:
    """HealthCheckProgram's answer for ``node`` from the ledger: 0 clean, 1 flagged (with the reason)."""
    records = [r for r in health.read(ledger) if node in r["nodes"]]
    if not records:
        print(f"{node}: no probe in {ledger} holds it; nothing to say (exit 0)")
        return 0
    latest = records[-1]
    if node in latest["verdicts"]["flagged"]:
        why = "; ".join(latest["verdicts"]["slow_nodes"].get(node, [])) or "flagged"
        print(f"{node}: flagged by the probe of {latest['measured_at']}: {why}")
        return 1
    print(f"{node}: clean in the probe of {latest['measured_at']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

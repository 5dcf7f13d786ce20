"""``python -m launcher.health [key=value ...]``: probe every node of a partition or a node list, judge
them, keep the probe in the cluster's ledger and MLflow (docs/health.md).

    python -m launcher.health cluster=slurm cluster.partition=debug          # probe, judge, keep
    python -m launcher.health cluster=slurm cluster.partition=debug --show   # the ledger: latest, trend, verdict
    python -m launcher.health cluster=slurm cluster.partition=debug --check node3   # exit 1 when node3 is flagged
    python -m launcher.health --plan cluster=slurm cluster.declared=true health.nodes=1000

Every setting is checked before anything runs, the cluster's as a sweep's are (launcher/plan/grid.py:
types, ranges, shell safety, the backend's checks; cluster=local's emulated nodes by
limits.local_ranks_per_core); an unknown or mistyped setting or flag is refused naming the closest.

Exit status: 0 when nothing is flagged, 1 when a node or a link is, 2 when refused (nothing probed).
``--check NODE`` reads the ledger only (no job): 0 when NODE's latest probe flagged nothing of it (or
no probe holds it), 1 when it did, 3 undecided when a damaged ledger line may be NODE's latest probe;
the HealthCheckProgram script in docs/health.md drains the node on 1 only.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from contract.spec import ConfigError
from launcher.commands.command import FAILURE_EXIT, UNDECIDED_EXIT, USER_ERROR_EXIT, Command, Parser, Refused
from launcher.healthprobe import NODES_PER_JOB, Asked, cluster_key, plan_cost, run, said
from launcher.plan.clusterschema import known_backend
from launcher.report import health, healthledger

KEYS = {"cluster": "a backend's name (launcher/cluster/registry.py)", "cluster.partition": "a partition", "cluster.nodelist": "nodes, e.g. node[1-4]",
        "cluster.exclude": "nodes left out", "cluster.gpus_per_node": "GPUs per node (0: CPU)",
        "cluster.gpu_type": "the GPU model (sbatch --gpus-per-node=<type>:<n>)",
        "cluster.gpu_mem_gib": "declared GPUs' memory (--plan with cluster.declared=true)",
        "cluster.timeout_min": "the job's time limit", "cluster.python": "the nodes' interpreter",
        "cluster.declared": "true: --plan against health.nodes declared nodes", "output_root": "where the ledger is",
        "tracking.uri": "the MLflow store (default: <output_root>/mlflow.db)", "tracking.enabled": "false: no MLflow",
        "limits.local_ranks_per_core": "cluster=local: emulated nodes per core of this machine (8)",
        "health.repeats": "timings per figure and node", "health.margin": "how far below the fleet a node may be",
        "health.nodes": "nodes emulated on this machine (local), or declared (--plan)",
        "health.nodes_per_job": "the most nodes one job holds", "health.dcgm": "false: no dcgmi diag"}
# The settings the sweep's schema reads too: composed and checked as a sweep's are (launcher/plan/grid.py).
SWEEP_KEYS = [k for k in KEYS if not k.startswith("health.")]
PROG = "python -m launcher.health"
HELP = __doc__


def settings_of(ns: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """(settings, flags) from the ``key=value`` words and the flags read; an unknown key, or flags that
    do not go together, refused (:class:`Refused`) naming them."""
    settings: dict[str, str] = {}
    for arg in ns.settings:
        key, eq, value = arg.partition("=")
        if not eq or key not in KEYS:
            close = [k for k in KEYS if k.split(".")[-1] == key.split(".")[-1]]
            raise Refused(f"{arg!r} is not a setting of launcher.health" + (f" (did you mean {close[0]}?)" if close
                          else f"; the settings: {', '.join(KEYS)}"))
        settings[key] = value
    modes = [f for f in ("--plan", "--show", "--check") if getattr(ns, f[2:]) not in (False, None)]
    if len(modes) > 1:
        raise Refused(f"{' and '.join(modes)}: one at a time. Fix: run {PROG} once for each.")
    if ns.last is not None and not ns.show:
        raise Refused(f"--last {ns.last}: only means something with --show. Fix: add --show, or drop --last.")
    if ns.last is not None and ns.last < 1:
        raise Refused(f"--last {ns.last}: the probes to show, at least 1. Fix: e.g. --show --last 6.")
    if ns.check is not None and (not ns.check.strip() or "=" in ns.check or ns.check.startswith("-")):
        raise Refused(f"--check {ns.check!r}: takes a node's name (e.g. --check \"$(hostname -s)\"), and "
                      f"{'this is empty' if not ns.check.strip() else 'this is a setting or a flag'}. Fix: give the "
                      f"node's name right after --check.")
    flags = {f"--{k}": ("" if v is True else str(v)) for k, v in vars(ns).items()
             if k in ("plan", "show", "last", "check") and v not in (False, None)}
    return settings, flags


def _whole(settings: dict[str, str], key: str, default: int, least: int, fix: str) -> int:
    """A health.* count: a whole number of at least ``least``, else refused naming ``key``."""
    text = settings.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(key, text, "is not a whole number.", fix) from None
    if value < least:
        raise ConfigError(key, value, f"must be at least {least}.", fix)
    return value


def _yes(settings: dict[str, str], key: str, default: bool) -> bool:
    text = settings.get(key)
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise ConfigError(key, text, "is not a boolean.", f"use {key}=true or {key}=false.")
    return text.strip().lower() == "true"


def _composed(settings: dict[str, str]):
    """The settings the sweep reads too, composed and checked as a sweep's grid point is (types,
    ranges, shell safety, the backend's own checks): the one validator, launcher/plan/grid.py."""
    from launcher.masking import mask
    from launcher.plan import grid

    given = {k: v for k, v in settings.items() if k in SWEEP_KEYS and k != "cluster"}
    given.setdefault("cluster.timeout_min", "15")
    gpus = given.get("cluster.gpus_per_node", "0").strip()
    if gpus.isdigit() and int(gpus) > 0:  # the sweep's rule, one rank per GPU: the probe's one task per node
        given["cluster.tasks_per_node"] = gpus
    # Every value quoted for Hydra's grammar, as a string the schema converts: node[1-4] stays a node list.
    overrides = [f"cluster={settings.get('cluster', 'local')}"] + [
        f'{k}="' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for k, v in given.items()]
    try:
        return grid.compose([overrides], [])[0].config
    except grid.SweepError as exc:
        text = str(exc)
        where = f"[{' '.join(overrides)}] "
        raise Refused(mask("", text[len(where):] if text.startswith(where) else text).rstrip(".")) from None


def asked_from(settings: dict[str, str]) -> Asked:
    """What the probe is asked, every setting checked before anything runs."""
    from launcher.plan.schema import check_local_ranks

    known_backend(settings.get("cluster", "local"))
    config = _composed(settings)
    cluster = config.cluster
    if cluster.timeout_min == "auto":
        raise Refused("cluster.timeout_min='auto': each sweep cell's own limit from forecasts; a probe's jobs take "
                      "whole minutes. Fix: give cluster.timeout_min=15 (the default) or drop it.")
    margin_text = settings.get("health.margin", str(health.MARGIN))
    try:
        margin = float(margin_text)
    except ValueError:
        margin = math.nan
    if not 0 <= margin < 1:
        raise ConfigError("health.margin", margin_text, "must be a share below 1.",
                          "e.g. health.margin=0.1 (10% below the fleet).")
    emulated = cluster.one_machine or cluster.declared
    if "health.nodes" in settings and not emulated:
        raise ConfigError("health.nodes", settings["health.nodes"], f"is read with cluster=local (nodes emulated on "
                          f"this machine) or cluster.declared=true, and cluster={cluster.name} probes its own nodes.",
                          "drop it, and choose the nodes with cluster.partition, cluster.nodelist or cluster.exclude.")
    nodes = _whole(settings, "health.nodes", 0 if cluster.declared else 1, 1,
                   "give the nodes to probe, e.g. health.nodes=3 (a verdict needs 3 or more).")
    if cluster.one_machine and not cluster.declared:
        check_local_ranks("health.nodes", nodes, nodes, config.limits.local_ranks_per_core)
    root = Path(config.output_root)
    uri = config.tracking.uri or f"sqlite:///{(root / 'mlflow.db').resolve()}"
    return Asked(cluster, root, emulated_nodes=nodes,
                 repeats=_whole(settings, "health.repeats", 5, 1, "give the timings per figure and node, e.g. "
                                "health.repeats=5 (a verdict needs several)."),
                 margin=margin, tracking_uri=uri if config.tracking.enabled else None,
                 nodes_per_job=_whole(settings, "health.nodes_per_job", NODES_PER_JOB, 1,
                                      f"give the most nodes one job holds, e.g. health.nodes_per_job={NODES_PER_JOB}."),
                 dcgm=_yes(settings, "health.dcgm", True))


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


class HealthCommand(Command):
    name = "health"
    nothing = "nothing was probed"
    help_text = HELP

    def add_arguments(self, parser: Parser) -> None:
        parser.add_argument("--plan", action="store_true")
        parser.add_argument("--show", action="store_true")
        parser.add_argument("--last", type=int, metavar="N")
        parser.add_argument("--check", metavar="NODE")
        parser.add_argument("settings", nargs="*")

    def run(self, args: argparse.Namespace) -> int:
        return health_of(args)


main = HealthCommand.main


def health_of(ns: argparse.Namespace) -> int:
    """Probe, plan, show or check, as the flags ask; every setting checked before anything runs."""
    try:
        settings, flags = settings_of(ns)
        asked = asked_from(settings)
        if "--plan" in flags:
            if asked.emulated_nodes < 1:
                raise ConfigError("health.nodes", asked.emulated_nodes, "--plan with cluster.declared=true needs the "
                                  "nodes to probe.", "give health.nodes=N.")
            print("\n".join(plan_lines(asked)))
            return 0
        if asked.cluster.declared:
            raise ConfigError("cluster.declared", True, "describes nodes that are not there.",
                              "use it with --plan, or drop it to probe real nodes.")
    except (ConfigError, Refused) as exc:
        said_so = "nothing was" in str(exc).lower()
        print(f"error: {exc}" if said_so else f"error: {str(exc).rstrip('.')}. Nothing was probed.", file=sys.stderr)
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
    return FAILURE_EXIT if probed.verdicts.flagged or probed.verdicts.slow_links else 0


def check(ledger: Path, node: str) -> int:
    """HealthCheckProgram's answer for ``node`` from the ledger: 0 clean (or never probed), 1 flagged
    (with the reason), 3 undecided: a damaged line after the node's latest readable probe may be its
    latest probe (docs/health.md: a damaged ledger is no evidence against a node, nor for it)."""
    read = healthledger.read_ledger(ledger)
    holding = [(n, r) for n, r in read.records if node in r["nodes"]]
    since = holding[-1][0] if holding else 0
    damaged = [(n, why) for n, why in read.damaged if n > since and healthledger.may_hold(read, n, node)]
    if damaged:
        line, why = damaged[-1]
        after = (f"after its latest readable probe ({holding[-1][1]['measured_at']}, line {since})" if holding
                 else "and no readable probe holds it")
        print(f"{node}: undecided (exit {UNDECIDED_EXIT}): line {line} of {ledger} is damaged ({why}) and may be "
              f"{node}'s latest probe, {after}; a damaged record is no evidence either way. Fix: probe again "
              f"({PROG} ...): its record supersedes the damaged one; or repair or delete line {line}.")
        return UNDECIDED_EXIT
    if not holding:
        print(f"{node}: no probe in {ledger} holds it; nothing to say (exit 0)")
        return 0
    latest = holding[-1][1]
    if node in latest["verdicts"]["flagged"]:
        why = "; ".join(latest["verdicts"]["slow_nodes"].get(node, [])) or "flagged"
        print(f"{node}: flagged by the probe of {latest['measured_at']}: {why}")
        return FAILURE_EXIT
    print(f"{node}: clean in the probe of {latest['measured_at']}")
    return 0

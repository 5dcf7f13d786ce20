"""Direct Slurm queries: partitions (sinfo), job states (sacct), cancellation (scancel).

Submission itself goes through submitit only (launcher/cluster/submit.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from contract.nodelist import expand_nodelist
from launcher.plan import fit
from launcher.plan.cell import Cell
from launcher.plan.grid import SweepError

__all__ = ["JobRecord", "cancel", "check_partitions", "job_records", "job_states", "max_array_size", "partitions"]


# Where Slurm's own commands look for their configuration (besides $SLURM_CONF), including the
# configless cache that slurmd keeps on a node.
CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf",
              "/run/slurm/conf/slurm.conf")


def configured() -> bool:
    return bool(os.environ.get("SLURM_CONF")) or any(Path(p).exists() for p in CONF_PATHS)


def partitions() -> dict[str, dict]:
    """{partition: {"nodes", "max_nodes", "default", "cpus", "mem_mb", "gpu_types"}} from sinfo."""
    if not shutil.which("sinfo"):
        raise SweepError("cluster=slurm: sinfo is not on PATH, so this machine cannot reach a Slurm cluster. "
                         "Fix: run from a login node (or export SLURM_CONF for the local test cluster), or use cluster=local.")
    if not configured():
        raise SweepError("cluster=slurm: no Slurm configuration on this machine (SLURM_CONF is not set and none of "
                         f"{', '.join(CONF_PATHS)} exists), and asking Slurm anyway would look its controller up in "
                         "DNS. Fix: export SLURM_CONF=/path/to/slurm.conf (the local test cluster prints it), or run "
                         "from a login node of the cluster.")
    proc = subprocess.run(["sinfo", "--noheader", "--format=%P|%D|%l|%c|%m|%G"], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0:
        raise SweepError(f"cluster=slurm: sinfo failed ({proc.stderr.strip()}). Fix: check that Slurm answers "
                         f"(sinfo) before submitting.")
    out = parse_sinfo(proc.stdout)
    proc = subprocess.run(["scontrol", "show", "partition", "--oneliner"], capture_output=True, text=True, timeout=30)
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name = fields.get("PartitionName", "")
        if name in out:
            max_nodes = fields.get("MaxNodes", "UNLIMITED")
            out[name]["max_nodes"] = None if max_nodes == "UNLIMITED" else int(max_nodes)
    return out


def parse_sinfo(text: str) -> dict[str, dict]:
    """Partitions from ``sinfo --format=%P|%D|%l|%c|%m|%G`` (one line per partition and node kind)."""
    out: dict[str, dict] = {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        name, nodes, _limit, cpus, mem_mb, gres = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        entry = out.setdefault(name, {"nodes": 0, "default": default, "cpus": None, "mem_mb": None,
                                      "gpu_types": set()})
        entry["nodes"] += int(nodes)
        # gres such as "gpu:h100:8(S:0-1),nvme:1": the GPU models this kind of node holds.
        entry["gpu_types"] |= set(re.findall(r"(?:^|,)gpu:([A-Za-z][\w.-]*):\d", gres))
        node_cpus = int(cpus.rstrip("+")) if cpus.rstrip("+").isdigit() else None
        node_mem = int(mem_mb.rstrip("+")) if mem_mb.rstrip("+").isdigit() else None
        # The smallest node of the partition decides what every node can give.
        if node_cpus:
            entry["cpus"] = min(entry["cpus"] or node_cpus, node_cpus)
        if node_mem:
            entry["mem_mb"] = min(entry["mem_mb"] or node_mem, node_mem)
    return out


def check_partitions(cells: Sequence[Cell]) -> list[str]:
    """Errors for cells the partitions cannot run (partition, node counts, what the nodes hold,
    accounts); also resolves each GPU cell's CPUs, memory and GPU memory from its partition."""
    parts = partitions()
    errors = []
    for cell in cells:
        c = cell.cluster
        name = c.partition or next((p for p, v in parts.items() if v["default"]), None)
        if name not in parts:
            errors.append(f"[{cell.name}] cluster.partition={c.partition!r}: no such partition on this cluster. "
                          f"Fix: use one of {', '.join(sorted(parts))}.")
            continue
        limit = min(x for x in (parts[name]["nodes"], parts[name].get("max_nodes")) if x is not None)
        if cell.layout.nodes > limit:
            errors.append(f"[{cell.name}] nodes={cell.layout.nodes}: partition {name} allows at most {limit} "
                          f"node(s) per job. Fix: use nodes<={limit} or another partition.")
        if c.cpus_per_task is None and cell.layout.gpus_per_node and parts[name]["cpus"]:
            # A GPU rank needs cores for its DataLoader workers, NCCL's proxy threads and (offload) the
            # CPU optimizer: by default it gets its share of the node, not Slurm's single core.
            cell.layout.cpus_per_task = max(1, parts[name]["cpus"] // cell.layout.tasks_per_node)
        if c.mem_gb is None and cell.layout.gpus_per_node and parts[name]["mem_mb"]:
            # ... and its share of the node's memory (pinned host buffers, offloaded optimizer state).
            share = cell.layout.tasks_per_node / cell.layout.gpus_per_node
            c.mem_gb = int(parts[name]["mem_mb"] * share) / 1024  # whole MiB: never above the node
        if cell.layout.gpus_per_node:
            _gpu_memory(cell, name, parts[name]["gpu_types"], errors)
    if not errors:
        all_nodes = cluster_nodes()
        for cell in cells:
            name = cell.cluster.partition or next((p for p, v in parts.items() if v["default"]), "")
            errors += check_capacity(cell, name, all_nodes)
        _accounting(cells, errors)
    return errors


# ---- what the nodes hold: each request checked before sbatch sees it ----------------------------

@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    mem_mb: int
    gpus: tuple[tuple[str, int], ...]  # (gres type or "", count) per GPU kind on the node
    features: frozenset[str]
    state: str

    def gpu_count(self, gpu_type: str | None) -> int:
        return sum(n for t, n in self.gpus if gpu_type is None or t == gpu_type)


def parse_nodes(text: str) -> dict[str, Node]:
    """``sinfo -N -h -o '%N|%P|%c|%m|%G|%f|%T'`` (a line per node and partition) -> {name: Node}."""
    out: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 7 or not parts[0].strip():
            continue
        name, partition, cpus, mem_mb, gres, features, node_state = (p.strip() for p in parts)
        partitions = (*out[name].partitions, partition.rstrip("*")) if name in out else (partition.rstrip("*"),)
        gpus = tuple((m.group(1) or "", int(m.group(2)))
                     for m in re.finditer(r"(?:^|,)gpu(?::([A-Za-z][\w.-]*))?:(\d+)", gres))
        out[name] = Node(name, partitions, _number(cpus), _number(mem_mb), gpus,
                         frozenset(f for f in features.split(",") if f and f != "(null)"), node_state)
    return out


def _number(text: str) -> int:
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


def cluster_nodes() -> dict[str, Node]:
    return parse_nodes(_run(["sinfo", "-N", "-h", "-o", "%N|%P|%c|%m|%G|%f|%T"]))


_TAKES_JOBS = ("idle", "mixed", "allocated", "alloc", "completing", "planned")


def partition_nodes() -> dict[str | None, list[str]]:
    """Each partition's nodes that can take jobs, in order (None: the default partition's)."""
    nodes = cluster_nodes()
    default = next((p for p, v in partitions().items() if v["default"]), None)
    out: dict[str | None, list[str]] = {}
    for node in nodes.values():
        if node.state.rstrip("*~#$@+!%^-").lower() not in _TAKES_JOBS:
            continue  # down, drained, failing: a placement there would wait for good
        for part in node.partitions:
            out.setdefault(part, []).append(node.name)
    out[None] = out.get(default or "", [])
    return {k: sorted(v, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)])
            for k, v in out.items()}


def _features_match(constraint: str, features: frozenset[str]) -> bool | None:
    """A simple --constraint (``a``, ``a&b``, ``a|b``) against a node's features; None for the forms
    this does not judge (counts, brackets): Slurm decides those."""
    if re.fullmatch(r"[\w.-]+(&[\w.-]+)*", constraint):
        return all(f in features for f in constraint.split("&"))
    if re.fullmatch(r"[\w.-]+(\|[\w.-]+)+", constraint):
        return any(f in features for f in constraint.split("|"))
    return None


def _shortfalls(cell: Cell, node: Node) -> dict[str, str]:
    """{what: the cell's request} that ``node`` cannot give one of the cell's nodes (empty: it fits)."""
    c, lay = cell.cluster, cell.layout
    missing = {}
    cpus = lay.tasks_per_node * (lay.cpus_per_task or 1)
    if node.cpus and cpus > node.cpus:
        missing["cpus"] = (f"{cpus} CPUs per node (cluster.tasks_per_node={lay.tasks_per_node} x "
                           f"cluster.cpus_per_task={lay.cpus_per_task or 1})")
    if c.mem_gb and node.mem_mb and int(c.mem_gb * 1024) > node.mem_mb:
        missing["mem"] = f"{int(c.mem_gb * 1024)} MB of memory per node (cluster.mem_gb={c.mem_gb:g})"
    if lay.gpus_per_node and node.gpu_count(c.gpu_type) < lay.gpus_per_node:
        missing["gpus"] = f"{lay.gpus_per_node} {c.gpu_type + ' ' if c.gpu_type else ''}GPUs per node " \
                          f"(cluster.gpus_per_node)"
    if c.constraint and _features_match(c.constraint, node.features) is False:
        missing["features"] = f"nodes with features {c.constraint} (cluster.constraint)"
    return missing


def _most(kind: str, cell: Cell, nodes: list[Node]) -> str:
    """What the best of ``nodes`` has of ``kind``: the figure the fix is measured against."""
    if kind == "cpus":
        return f"the most a node has is {max(n.cpus for n in nodes)} CPUs"
    if kind == "mem":
        most = max(n.mem_mb for n in nodes)
        return f"the most a node has is {most} MB (cluster.mem_gb<={int(most / 1024 * 10) / 10:g})"
    if kind == "gpus":
        return f"the most a node has is {max(n.gpu_count(cell.cluster.gpu_type) for n in nodes)}"
    return "features there: " + (", ".join(sorted(set().union(*(n.features for n in nodes)))) or "none")


def check_capacity(cell: Cell, partition: str, nodes: dict[str, Node]) -> list[str]:
    """Errors for a cell whose request no node set of the partition can hold: CPUs, memory and GPUs
    per node, features, node counts after cluster.exclude and cluster.nodelist. What sbatch would
    refuse (or leave pending for good), said before anything is created, with the fix."""
    if not nodes:
        return []  # sinfo -N did not answer: sbatch decides
    c, want = cell.cluster, cell.layout.nodes
    where = f"[{cell.name}]"
    members = [n for n in nodes.values() if partition in n.partitions]
    excluded = set(expand_nodelist(c.exclude)) if c.exclude else set()
    if c.nodelist:
        errors = _nodelist_errors(cell, partition, nodes, members, excluded)
        if errors:
            return errors
    usable = [n for n in members if n.name not in excluded]
    fitting = [n for n in usable if not _shortfalls(cell, n)]
    if len(fitting) >= want:
        return []
    if not usable:
        return [f"{where} cluster.exclude={c.exclude} leaves none of the {len(members)} node(s) of partition "
                f"{partition}. Fix: exclude fewer nodes, or use another partition."]
    if not fitting:
        short: dict[str, str] = {}
        for n in usable:
            short.update(_shortfalls(cell, n))
        return [f"{where} {request}: no node of partition {partition} can give it ({_most(kind, cell, usable)}). "
                f"sbatch would refuse it. Fix: ask for what the nodes have (sinfo -N -l), or use another partition."
                for kind, request in short.items()]
    narrowed = " after " + " and ".join(x for x in (f"cluster.exclude={c.exclude}" if excluded else "",
                                                   f"cluster.constraint={c.constraint}" if c.constraint else "") if x)
    return [f"{where} nodes={want}: only {len(fitting)} of the {len(members)} node(s) of partition {partition} can "
            f"hold it{narrowed if narrowed != ' after ' else ''} ({', '.join(n.name for n in fitting)}). sbatch "
            f"would refuse it (or leave it pending for good). Fix: nodes<={len(fitting)}, exclude fewer nodes, or "
            f"ask for less per node."]


def _nodelist_errors(cell: Cell, partition: str, nodes: dict[str, Node], members: list[Node],
                     excluded: set[str]) -> list[str]:
    c, where = cell.cluster, f"[{cell.name}]"
    listed = expand_nodelist(c.nodelist or "")
    unknown = [n for n in listed if n not in nodes or partition not in nodes[n].partitions]
    if unknown:
        return [f"{where} cluster.nodelist={c.nodelist}: {', '.join(unknown)} not in partition {partition} (its "
                f"nodes: {', '.join(sorted(n.name for n in members))}). Fix: name nodes of the partition."]
    errors = []
    if excluded & set(listed):
        errors.append(f"{where} cluster.nodelist={c.nodelist} and cluster.exclude={c.exclude} both name "
                      f"{', '.join(sorted(excluded & set(listed)))}. Fix: drop it from one of them.")
    if len(listed) > cell.layout.nodes:
        errors.append(f"{where} cluster.nodelist={c.nodelist} names {len(listed)} nodes, but the cell runs on "
                      f"nodes={cell.layout.nodes}: sbatch refuses a node list longer than the node count. Fix: "
                      f"nodes={len(listed)}, or a shorter cluster.nodelist.")
    for name in listed:
        short = _shortfalls(cell, nodes[name])
        if short:
            errors.append(f"{where} cluster.nodelist={c.nodelist}: {name} cannot give {'; '.join(short.values())}. "
                          f"Fix: list other nodes, or ask for less.")
    return errors


# ---- accounts and QOS --------------------------------------------------------------------------

def parse_enforce(config_text: str) -> set[str]:
    """AccountingStorageEnforce of ``scontrol show config`` -> {"associations", "qos", ...} (empty: none).
    "limits" and "safe" imply associations, as in Slurm."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageEnforce":
            words = {w.strip().lower() for w in value.split(",") if w.strip() and w.strip().lower() != "none"}
            if words & {"limits", "safe"}:
                words.add("associations")
            return words
    return set()


def parse_associations(text: str) -> tuple[set[str], set[str]]:
    """``sacctmgr -n -P show assoc where user=U format=account,qos`` -> (accounts, QOS names)."""
    accounts, qos = set(), set()
    for line in text.splitlines():
        account, _, names = line.partition("|")
        if account.strip():
            accounts.add(account.strip())
        qos |= {q.strip() for q in names.split(",") if q.strip()}
    return accounts, qos


def _accounting(cells: Sequence[Cell], errors: list[str]) -> None:
    """cluster.account and cluster.qos against the user's associations: an error where the cluster
    enforces them, a warning where it does not (Slurm then accepts any name silently)."""
    asked = {(c.cluster.account, c.cluster.qos) for c in cells}
    if all(a is None and q is None for a, q in asked) or not shutil.which("sacctmgr"):
        return
    import getpass

    user = getpass.getuser()
    assoc = _call(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=account,qos"])
    if assoc is None:
        return  # no accounting database to ask
    accounts, qos = parse_associations(assoc)
    enforce = parse_enforce(_run(["scontrol", "show", "config"]))
    problems = []
    for account in sorted({a for a, _ in asked if a}):
        if account not in accounts:
            problems.append(("associations", f"cluster.account={account}: user {user} has no association with it "
                                             f"(sacctmgr: {', '.join(sorted(accounts)) or 'none'})"))
    for name in sorted({q for _, q in asked if q}):
        if name not in qos:
            problems.append(("qos", f"cluster.qos={name}: not among the QOS user {user} may use "
                                    f"({', '.join(sorted(qos)) or 'none'})"))
    for kind, text in problems:
        if kind in enforce:
            errors.append(f"{text}. Fix: use one of those (sacctmgr show assoc user={user}).")
        else:
            print(f"warning: {text}. This cluster does not enforce {kind} (AccountingStorageEnforce="
                  f"{','.join(sorted(enforce)) or 'none'}), so sbatch accepts it, but it is probably a typo.",
                  file=sys.stderr, flush=True)


def _gpu_memory(cell: Cell, partition: str, gpu_types: set[str], errors: list[str]) -> None:
    """The cell's GPU type must be one the partition has; its memory (or that of the partition's only
    GPU type) becomes cluster.gpu_mem_gib when none was given, so fit is checked against it."""
    c = cell.cluster
    if c.gpu_type and gpu_types and c.gpu_type not in gpu_types:
        errors.append(f"[{cell.name}] cluster.gpu_type={c.gpu_type}: partition {partition} has GPU type(s) "
                      f"{', '.join(sorted(gpu_types))} (sinfo's gres). Fix: use one of them, or another partition.")
        return
    types = {c.gpu_type} if c.gpu_type else gpu_types
    known = {fit.gpu_mem_gib_of(t) for t in types}
    if c.gpu_mem_gib is None and len(known) == 1 and None not in known:
        c.gpu_mem_gib = known.pop()


def _run(args: list[str]) -> str:
    return _call(args) or ""


def _call(args: list[str]) -> str | None:
    """The command's output, or None when it failed (a Slurm command that did not answer)."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def expand_array_ids(job: str) -> list[str]:
    """``123_[0-2,5%4]`` -> 123_0, 123_1, 123_2, 123_5 (sacct and squeue fold pending array tasks)."""
    base, sep, rest = job.partition("_[")
    if not sep:
        return [job]
    ids: list[str] = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi or lo) + 1))
    return ids


def parse_states(text: str) -> dict[str, str]:
    """``JobID|State`` lines (sacct -X -n -P, squeue -h -o '%i|%T') -> {job id: raw state}.

    A requeued job shows several records: the last one wins.
    """
    states: dict[str, str] = {}
    for line in text.splitlines():
        if "|" not in line:
            continue
        job, state = line.split("|", 1)
        for one in expand_array_ids(job.strip()):
            states[one] = state.strip()
    return states


def job_states(job_ids: list[str]) -> dict[str, str]:
    """{job id: Slurm state, e.g. RUNNING or "CANCELLED by 0"} from one sacct call, plus one squeue call
    for the ids sacct does not know yet (array tasks that have not started); ids neither knows are absent.
    launcher.state.slurm_status turns a state into a cell status."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    raw = parse_states(_run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(arrays)]))
    unknown = [j for j in job_ids if j not in raw]
    if unknown:
        queued = parse_states(_run(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(arrays)]))
        raw.update({j: queued[j] for j in unknown if j in queued})
    return {j: raw[j] for j in job_ids if j in raw}


# States in which a job is still in Slurm's queue (squeue lists it): accounting may lag them.
QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING", "SUSPENDED",
          "RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "PREEMPTED")


# How a start ends when Slurm requeues the job (a cancelled job still COMPLETING is not requeued).
REQUEUE_CAUSES = ("NODE_FAIL", "PREEMPTED", "REQUEUED", "BOOT_FAIL", "TIMEOUT", "FAILED")


@dataclass(frozen=True)
class JobRecord:
    """What Slurm last said about one job (or array task), from accounting and the queue together.

    ``state`` is the live queue's state while the job is queued (squeue), else the state of its
    latest accounting record (sacct). A requeued job has one accounting record per start: the
    earlier ones are its ``history`` (``NODE_FAIL on node[1-2]``) and their number its ``restarts``.
    """

    state: str  # Slurm's own words, e.g. RUNNING, COMPLETED, "CANCELLED by 0", NODE_FAIL
    restarts: int = 0
    history: tuple[str, ...] = ()
    in_queue: bool = False
    # Accounting still says PENDING, but the queue (which answered) no longer holds the job: it
    # left the queue without starting, which only a cancellation does (scancel of a pending task).
    left_queue: bool = False
    started: tuple[float, float, tuple[str, ...]] | None = None  # (start s, end s or now, hosts) of the latest start


@dataclass(frozen=True)
class _Row:
    state: str
    nodes: str
    start: str
    end: str


def first_word(state: str) -> str:
    """``"CANCELLED by 0"`` -> CANCELLED; ``"COMPLETED+"`` -> COMPLETED."""
    return state.split()[0].rstrip("+").upper() if state.strip() else ""


def parse_sacct_records(text: str) -> tuple[dict[str, list[_Row]], dict[str, _Row]]:
    """``JobID|State|NodeList|Start|End`` lines (sacct -X -D -n -P) -> (every record of each job, in
    order; the folded record of not-yet-started array tasks, ``123_[2-4]``, for each task it covers)."""
    records: dict[str, list[_Row]] = {}
    folded: dict[str, _Row] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 5:
            continue
        job, *fields = (p.strip() for p in parts)
        row = _Row(*fields)
        if "_[" in job:
            folded.update({one: row for one in expand_array_ids(job)})
        else:
            records.setdefault(job, []).append(row)
    return records, folded


def merge_records(sacct_text: str, squeue_text: str | None, job_ids: list[str]) -> dict[str, JobRecord]:
    """{job id: JobRecord} from one sacct output (all records, -D) and one squeue output (None when
    squeue failed: then nothing is concluded from a job's absence). Ids neither knows are absent."""
    records, folded = parse_sacct_records(sacct_text)
    queue = parse_states(squeue_text) if squeue_text is not None else None
    out: dict[str, JobRecord] = {}
    # Arrays that Slurm still knows: a task of one that neither accounting nor the queue lists was
    # cancelled before it started (scancel of a pending task before accounting folded the array).
    known = {j.split("_")[0] for j in (*records, *folded, *(queue or {}))}
    for job in job_ids:
        rows = records.get(job) or ([folded[job]] if job in folded else [])
        live = queue.get(job) if queue is not None else None
        if live is None and not rows:
            if queue is not None and "_" in job and job.split("_")[0] in known:
                out[job] = JobRecord(state="PENDING", left_queue=True)
            continue
        last = rows[-1] if rows else None
        earlier = list(rows[:-1])
        if live is not None and last is not None and first_word(last.state) in REQUEUE_CAUSES \
                and first_word(live) != "COMPLETING":
            earlier = list(rows)  # requeued: the queue holds its next start, accounting has not recorded it yet
        history = tuple(f"{r.state} on {r.nodes}" if r.nodes and r.nodes != "None assigned" else r.state
                        for r in earlier)
        state = live or (last.state if last else "")
        left = live is None and queue is not None and first_word(state) in ("PENDING", "REQUEUED")
        started = next(((_epoch(r.start), datetime.now().timestamp() if r.end in ("Unknown", "None", "")
                         else _epoch(r.end), tuple(expand_nodelist(r.nodes)))
                        for r in reversed(rows) if r.start not in ("Unknown", "None", "")
                        and r.nodes and r.nodes != "None assigned"), None)
        out[job] = JobRecord(state=state, restarts=len(history), history=history, in_queue=live is not None,
                             left_queue=left, started=started)
    return out


def job_records(job_ids: list[str]) -> dict[str, JobRecord]:
    """One sacct call (every record of every job: requeues included) and one squeue call, whatever
    the number of jobs; see :func:`merge_records`."""
    if not job_ids:
        return {}
    arrays = ",".join(sorted({j.split("_")[0] for j in job_ids}))
    acct = _run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State,NodeList,Start,End", "-j", arrays])
    queue = _call(["squeue", "-h", "-o", "%i|%T", "-j", arrays])
    return merge_records(acct, queue, job_ids)


def job_times(job_ids: list[str]) -> dict[str, tuple[float, float, list[str]]]:
    """{job id: (start epoch s, end epoch s, hosts)} of the jobs that have started, from one sacct call."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    return parse_sacct_times(_run(["sacct", "-X", "-n", "-P", "-o", "JobID,Start,End,NodeList", "-j", ",".join(arrays)]))


def parse_sacct_times(text: str) -> dict[str, tuple[float, float, list[str]]]:
    """``JobID|Start|End|NodeList`` lines (sacct -X -n -P) -> {job id: (start_s, end_s, hosts)}; jobs that
    have not started are left out, and a running job ends now."""
    out = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 4 or parts[1] in ("Unknown", "None", ""):
            continue
        job, start, end, nodes = parts
        end_s = datetime.now().timestamp() if end in ("Unknown", "None", "") else _epoch(end)
        if nodes and nodes != "None assigned":
            out[job] = (_epoch(start), end_s, expand_nodelist(nodes))
    return out


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def max_array_size() -> int | None:
    """The cluster's MaxArraySize (``scontrol show config``): an array may hold that many tasks."""
    return parse_max_array_size(_run(["scontrol", "show", "config"]))


def parse_max_array_size(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return None


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, text=True, timeout=60)

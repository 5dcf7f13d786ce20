"""What a Slurm cluster can give, asked before anything is created: partitions (sinfo, scontrol),
the nodes each request could run on, accounts and QOS (sacctmgr), MaxArraySize.

:func:`check` is pure: it returns what it resolved for each cell and what is wrong, and changes no
cell; the caller (launcher/preflight.py) applies what was resolved.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.cluster.base import Resolved, ResourceCheck
from launcher.cluster.slurm import settings
from launcher.cluster.slurm.commands import CONF_PATHS, call, configured, run
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.plan import fit
from launcher.plan.cell import Cell
from launcher.plan.grid import SweepError


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


def check(cells: Sequence[Cell]) -> ResourceCheck:
    """Errors for cells the partitions cannot run (partition, node counts, what the nodes hold,
    accounts), and each GPU cell's CPUs, memory and GPU memory as its partition resolves them."""
    parts = partitions()
    out = ResourceCheck()
    for cell in cells:
        name = settings.of(cell.cluster).partition or _default(parts)
        if name not in parts:
            out.errors.append(f"[{cell.name}] cluster.partition={settings.of(cell.cluster).partition!r}: no such partition on this "
                              f"cluster. Fix: use one of {', '.join(sorted(parts))}.")
            continue
        out.errors += _node_count(cell, name, parts[name])
        out.resolved[cell.index] = resolve(cell, parts[name])
        if cell.layout.gpus_per_node:
            out.errors += _gpu_type(cell, name, parts[name]["gpu_types"])
    if not out.errors:
        all_nodes = cluster_nodes()
        for cell in cells:
            resolved = as_resolved(cell, out.resolved.get(cell.index))
            out.errors += check_capacity(resolved, settings.of(cell.cluster).partition or _default(parts) or "", all_nodes)
        _accounting(cells, out)
    return out


def _default(parts: dict[str, dict]) -> str | None:
    return next((p for p, v in parts.items() if v["default"]), None)


def _node_count(cell: Cell, name: str, part: dict) -> list[str]:
    limit = min(x for x in (part["nodes"], part.get("max_nodes")) if x is not None)
    if cell.layout.nodes <= limit:
        return []
    return [f"[{cell.name}] nodes={cell.layout.nodes}: partition {name} allows at most {limit} node(s) per job. "
            f"Fix: use nodes<={limit} or another partition."]


def resolve(cell: Cell, part: dict) -> Resolved:
    """What the partition decides for a GPU cell that left it open: its cores, memory, GPU memory."""
    c, lay, out = cell.cluster, cell.layout, Resolved()
    if not lay.gpus_per_node:
        return out
    if c.cpus_per_task is None and part["cpus"]:
        # A GPU rank needs cores for its DataLoader workers, NCCL's proxy threads and (offload) the
        # CPU optimizer: by default it gets its share of the node, not Slurm's single core.
        out.cpus_per_task = max(1, part["cpus"] // lay.tasks_per_node)
    if c.mem_gb is None and part["mem_mb"]:
        # ... and its share of the node's memory (pinned host buffers, offloaded optimizer state).
        out.mem_gb = int(part["mem_mb"] * lay.tasks_per_node / lay.gpus_per_node) / 1024  # whole MiB
    # The memory of its GPU type (or of the partition's only GPU type): fit is checked against it.
    known = {fit.gpu_mem_gib_of(t) for t in ({c.gpu_type} if c.gpu_type else part["gpu_types"])}
    if c.gpu_mem_gib is None and len(known) == 1 and None not in known:
        out.gpu_mem_gib = known.pop()
    return out


def as_resolved(cell: Cell, resolved: Resolved | None) -> Cell:
    """A copy of ``cell`` with ``resolved`` applied, to check what it will ask for; ``cell`` is unchanged."""
    if resolved is None:
        return cell
    copy = dataclasses.replace(cell, layout=dataclasses.replace(cell.layout),
                               cluster=dataclasses.replace(cell.cluster))
    resolved.apply(copy)
    return copy


def _gpu_type(cell: Cell, partition: str, gpu_types: set[str]) -> list[str]:
    """The cell's GPU type must be one the partition has."""
    c = cell.cluster
    if not (c.gpu_type and gpu_types and c.gpu_type not in gpu_types):
        return []
    return [f"[{cell.name}] cluster.gpu_type={c.gpu_type}: partition {partition} has GPU type(s) "
            f"{', '.join(sorted(gpu_types))} (sinfo's gres). Fix: use one of them, or another partition."]


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
    return parse_nodes(run(["sinfo", "-N", "-h", "-o", "%N|%P|%c|%m|%G|%f|%T"]))


def partition_nodes(names: set[str | None]) -> str:
    """The nodes of partitions ``names`` (None: the default partition), one ``name CPUs memory GPUs``
    per node, sorted: what names the hardware a fabric probe measures (its state left out)."""
    wanted = {n for n in names if n} | ({_default_partition()} if None in names else set())
    return describe_nodes(cluster_nodes(), wanted)


def describe_nodes(nodes: dict[str, Node], partitions: set[str]) -> str:
    def gpus(node: Node) -> str:
        return ",".join(f"{kind or 'gpu'}:{count}" for kind, count in node.gpus) or "no GPUs"

    return "; ".join(f"{n.name} {n.cpus} CPUs {n.mem_mb} MB {gpus(n)}"
                     for n in sorted(nodes.values(), key=lambda n: n.name) if partitions & set(n.partitions))


def _default_partition() -> str:
    return next((name for name, p in partitions().items() if p.get("default")), "")


_TAKES_JOBS = ("idle", "mixed", "allocated", "alloc", "completing", "planned")


def schedulable_nodes() -> dict[str | None, list[str]]:
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
    constraint = settings.of(c).constraint
    if constraint and _features_match(constraint, node.features) is False:
        missing["features"] = f"nodes with features {constraint} (cluster.constraint)"
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
    c, want = settings.of(cell.cluster), cell.layout.nodes
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
    constraint = settings.of(c).constraint
    narrowed = " after " + " and ".join(x for x in (f"cluster.exclude={c.exclude}" if excluded else "",
                                                   f"cluster.constraint={constraint}" if constraint else "") if x)
    return [f"{where} nodes={want}: only {len(fitting)} of the {len(members)} node(s) of partition {partition} can "
            f"hold it{narrowed if narrowed != ' after ' else ''} ({', '.join(n.name for n in fitting)}). sbatch "
            f"would refuse it (or leave it pending for good). Fix: nodes<={len(fitting)}, exclude fewer nodes, or "
            f"ask for less per node."]


def _nodelist_errors(cell: Cell, partition: str, nodes: dict[str, Node], members: list[Node],
                     excluded: set[str]) -> list[str]:
    c, where = settings.of(cell.cluster), f"[{cell.name}]"
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


def _accounting(cells: Sequence[Cell], out: ResourceCheck) -> None:
    """cluster.account and cluster.qos against the user's associations: an error where the cluster
    enforces them, a warning where it does not (Slurm then accepts any name silently)."""
    asked = {(s.account, s.qos) for s in (settings.of(c.cluster) for c in cells)}
    if all(a is None and q is None for a, q in asked) or not shutil.which("sacctmgr"):
        return
    import getpass

    user = getpass.getuser()
    assoc = call(["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}", "format=account,qos"])
    if assoc is None:
        return  # no accounting database to ask
    accounts, qos = parse_associations(assoc)
    enforce = parse_enforce(run(["scontrol", "show", "config"]))
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
            out.errors.append(f"{text}. Fix: use one of those (sacctmgr show assoc user={user}).")
        else:
            out.warnings.append(f"{text}. This cluster does not enforce {kind} (AccountingStorageEnforce="
                                f"{','.join(sorted(enforce)) or 'none'}), so sbatch accepts it, but it is probably a typo.")


def max_array_size() -> int | None:
    """The cluster's MaxArraySize (``scontrol show config``): an array may hold that many tasks."""
    return parse_max_array_size(run(["scontrol", "show", "config"]))


def parse_max_array_size(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize" and value.strip().isdigit():
            return int(value.strip())
    return None



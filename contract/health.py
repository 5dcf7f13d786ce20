"""The node health probe's contract: what a probe job is asked, the figures it returns, the ring of
pairs it times, and what a probe costs. Standard library only: the ranks measure (jobs/nodeprobe.py),
the launcher plans the job and judges the figures (launcher/report/health.py).

One job, one task per node. Each node measures its own figures ``repeats`` times:

* ``matmul_gflops``: the compute ceiling, dense float32 matmuls (GFLOP/s = 2 n^3 / t / 1e9; on a GPU
  the same figure, in the cell's dtype, reads as TFLOP/s x 1000);
* ``copy_gb_per_s``: memory bandwidth, one large tensor copied (STREAM's Copy convention: the bytes
  read plus the bytes written, over the time);
* ``step_samples_per_s``: a short step of the worker itself (the project's model, optimizer and
  synthetic batches, on this node alone: jobs/loop.py's Trainer);

and every pair of the ring (node i with node i+1, the last with the first) times ``repeats``
all-reduces of ``pair_bytes`` between its two nodes: ``pair_busbw_gb_per_s``, nccl-tests' bus
bandwidth of a 2-rank all-reduce (contract/fabric.py). A ring gives every node two pairs and the
pairs number as many as the nodes: a slow node slows both of its pairs and its own figures, a slow
link one pair only. The pairs run in rounds in which no node is in two pairs (two rounds, three for
an odd ring), so the pairs' wall time does not grow with the nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract.spec import Layout

RESULT_FILE = "health.json"  # what the probe's rank 0 writes into its folder
# The figures of one node, each higher-is-better, with its unit in words.
NODE_FIGURES: dict[str, str] = {
    "matmul_gflops": "GFLOP/s of dense float32 matmuls (the compute ceiling)",
    "copy_gb_per_s": "GB/s of a large copy (bytes read + bytes written; memory bandwidth)",
    "step_samples_per_s": "samples/s of a short step of the worker's own model on the node alone",
}
PAIR_FIGURE = "pair_busbw_gb_per_s"
PAIR_UNIT = "GB/s of bus bandwidth of a 2-rank all-reduce between the pair's nodes"


@dataclass
class NodeProbeSpec:
    """What one health probe job measures; the launcher writes it beside the result."""

    out_dir: str
    nodes: int
    cpus_per_task: int = 0  # torch's threads; 0: every CPU the task may use
    gpus_per_node: int = 0
    repeats: int = 5
    matmul_n: int = 512  # CPU; a GPU node uses matmul_peak's size that fits
    copy_bytes: int = 64 * 1024**2  # CPU; a GPU node copies 1 GiB
    pair_bytes: int = 4 * 1024**2  # CPU (gloo); a GPU pair 256 MiB
    step_model: str = "gpt_tiny"
    step_batch_size: int = 4
    step_seq_len: int = 32
    min_time_s: float = 0.2  # each repeat of each figure runs at least this long
    emulate_nodes: bool = False  # the local cluster: the nodes are groups of processes on this machine
    # None: in turn when the nodes share one machine's cores (one kernel), else all at once.
    in_turn: bool | None = None
    dcgm: bool = True  # run `dcgmi diag -r 1` where dcgmi is installed
    collective_timeout_s: float = 300.0

    @property
    def layout(self) -> Layout:
        """One task per node: the shape a backend's rank translation reads (the emulated nodes' too)."""
        return Layout(nodes=self.nodes, tasks_per_node=1, gpus_per_node=self.gpus_per_node,
                      cpus_per_task=max(1, self.cpus_per_task))


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """The ring: (i, i+1) for every node, the last with the first; two nodes have one pair, one none."""
    if nodes < 2:
        return []
    if nodes == 2:
        return [(0, 1)]
    return [(i, (i + 1) % nodes) for i in range(nodes)]


def pair_rounds(nodes: int) -> list[list[tuple[int, int]]]:
    """The ring's pairs in rounds in which no node is in two pairs: even pairs, odd pairs, and for an
    odd ring the closing pair alone (at most three rounds, whatever the number of nodes)."""
    pairs = ring_pairs(nodes)
    rounds: list[list[tuple[int, int]]] = [[], [], []]
    for i, pair in enumerate(pairs):
        rounds[2 if (nodes % 2 and i == nodes - 1 and nodes > 2) else i % 2].append(pair)
    return [r for r in rounds if r]


@dataclass(frozen=True)
class Cost:
    """What a probe of ``nodes`` nodes asks of the cluster and how long it holds them."""

    nodes: int
    jobs: int
    pairs: int
    rounds: int
    measured_s: float  # the measurements' own time (figures x repeats, then the pair rounds)
    wall_s: float  # the job's: start-up (imports, the process group) + the measurements


def cost(nodes: int, nodes_per_job: int, in_turn: bool, node_s: float, pair_s: float, start_s: float) -> Cost:
    """The cost of a probe: one job per ``nodes_per_job`` nodes (each its own ring), ``node_s`` of a
    node's own figures, ``pair_s`` of one pair's timings, ``start_s`` of a job's start-up. Nodes that
    share one machine's cores measure in turn (``in_turn``): then time grows with the nodes."""
    jobs = max(1, math.ceil(nodes / nodes_per_job))
    per_job = math.ceil(nodes / jobs)
    pairs = sum(len(ring_pairs(min(per_job, nodes - j * per_job))) for j in range(jobs))
    rounds = len(pair_rounds(per_job))
    if in_turn:
        measured = per_job * node_s + len(ring_pairs(per_job)) * pair_s
    else:
        measured = node_s + rounds * pair_s
    return Cost(nodes, jobs, pairs, rounds, measured, start_s + measured)

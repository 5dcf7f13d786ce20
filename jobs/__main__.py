"""One rank of one cell, or of a probe, from its spec file, with no pickle: ``python -m jobs SPEC.json
[--out DIR]``. A probe's file names its program (contract/programs.py: the fabric probe,
jobs/fabric.py, or the node-health probe, jobs/nodeprobe.py); any other file is a cell's spec.json.

Every rank program of every backend starts here (:func:`run_file`): under ``torchrun
--nproc-per-node N -m jobs spec.json`` (one machine: the torchrun backend, a site's backend, or a
cell reproduced by hand from its reproduce.sh), ``srun ... python -m jobs spec.json`` in an
allocation, or as what submitit pickles (:class:`SpecFile`: the file's path, nothing else; the
local and Slurm backends). The rank's place comes from the environment its launcher gives it
(jobs/dist.py, the one reader), regrouped into the spec's emulated nodes where one machine's ranks
were started as one node; the spec is the cell's ``spec.json`` (contract/codec.py: the RunSpec the
launcher wrote), and the results land in the spec's ``out_dir`` (result.json, metrics.jsonl,
ranks/). ``--out DIR``: write them there instead, and log no MLflow run (a run by hand never writes
over the sweep's figures or its runs).

The spec is validated when it is read as it was when it was written (RunSpec.validate: the schema's
own checks), so a spec edited by hand (``batch_size: 0``, ``lr: NaN``, an unknown key) is refused
naming the setting before any rank starts. The command line is read as the launcher's commands read
theirs (contract/commandline.py: no abbreviation, a mistyped flag refused naming the closest). Exit
codes: 0 done, 2 refused (docs/troubleshooting.md).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from contract import programs, rank_env, records
from contract.codec import from_plain
from contract.commandline import USER_ERROR_EXIT, Parser, Refused
from contract.fabric import ProbeSpec
from contract.health import NodeProbeSpec
from contract.spec import ConfigError, RunSpec

SPEC_FIX = "give a cell's spec.json from its sweep directory (<sweep>/cells/<cell>/spec.json)."


def load(path: str, out_dir: str | None = None) -> RunSpec:
    """The cell's RunSpec from ``path``, validated; with ``out_dir``, redirected there and untracked."""
    try:
        spec = from_plain(RunSpec, records.read_document(Path(path), "a cell spec", SPEC_FIX, checked=True))
    except (OSError, ValueError, TypeError, KeyError, records.RecordError) as exc:
        raise Refused(f"python -m jobs {path}: not a readable cell spec ({type(exc).__name__}: {exc}). "
                      f"Fix: {SPEC_FIX}") from None
    try:
        spec.validate()
    except ConfigError as exc:
        raise Refused(f"python -m jobs {path}: a setting of this spec is refused, nothing was run: {exc}") from None
    if out_dir is None:
        _out_folder(spec.out_dir, f"{path}'s out_dir")  # a hand-edited one that is a file: refused first
        return spec
    out = _out_folder(out_dir)
    sweeps = {Path(spec.out_dir).resolve(), Path(path).resolve().parent}
    if out in sweeps or (out / "spec.json").exists():
        raise Refused(f"--out {out_dir}: {out} is a cell's own directory: its result.json and metrics.jsonl are the "
                      f"sweep's figures, which a run by hand never writes over. Fix: leave --out out (reproduce.sh "
                      f"writes to the cell's reproduced/), or give a directory of its own.")
    out.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(spec, out_dir=str(out), tracking_uri=None, run_id=None)


def load_probe(path: str, out_dir: str | None = None) -> ProbeSpec | NodeProbeSpec | None:
    """The probe's spec when ``path`` is a probe's file (redirected to ``out_dir`` if given); None when
    it is not one (a cell's spec.json, read by :func:`load`)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # load() says what is wrong with it
    if not programs.is_probe(data):
        return None
    try:
        _, spec = programs.read(data)
    except (ValueError, TypeError, KeyError) as exc:
        raise Refused(f"python -m jobs {path}: not a readable probe spec ({type(exc).__name__}: {exc}). Fix: give "
                      f"the {programs.SPEC_FILE} its backend wrote.") from None
    return dataclasses.replace(spec, out_dir=str(_out_folder(out_dir))) if out_dir else spec


def _out_folder(out_dir: str, what: str = "--out") -> Path:
    """The results' folder (``--out``, or the spec's out_dir), refused where it names a file."""
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise Refused(f"{what} {out_dir}: {out} is a file, not a folder. Fix: give a folder (made if missing) for the "
                      f"results, or leave --out out. Nothing was run.")
    return out


def emulated_nodes(environ: Mapping[str, str], tasks_per_node: int) -> dict[str, str]:
    """torchrun's variables regrouped into emulated nodes of ``tasks_per_node`` ranks, where one
    machine's ranks were started as one node (a probe of nodes emulated here, as the local executor's
    translation numbers them: launcher/cluster/local/ranks.py); {} where nothing is to regroup."""
    if "RANK" not in environ or int(environ.get("LOCAL_WORLD_SIZE", "1")) <= tasks_per_node:
        return {}
    rank, machine = int(environ["RANK"]), int(environ["LOCAL_WORLD_SIZE"])
    return {"LOCAL_RANK": str(rank % tasks_per_node), "LOCAL_WORLD_SIZE": str(tasks_per_node),
            "GROUP_RANK": str(rank // tasks_per_node), rank_env.MACHINE_RANK: environ.get("LOCAL_RANK", str(rank)),
            rank_env.MACHINE_RANKS: str(machine)}


def run_file(path: str, out_dir: str | None = None) -> None:
    """One rank of the cell or probe whose spec file is ``path`` (results to ``out_dir`` if given): its
    place regrouped where the spec emulates nodes, then its program. Refused: the file or a setting
    in it, before the rank starts."""
    spec: RunSpec | ProbeSpec | NodeProbeSpec | None = load_probe(path, out_dir)
    if spec is None:
        spec = load(path, out_dir)
    if spec.emulate_nodes:
        os.environ.update(emulated_nodes(os.environ, spec.layout.tasks_per_node))
    try:
        _run_program(spec)
    finally:
        # The objects alive now live until the process exits: frozen, the interpreter's shutdown
        # collections skip them. With torch._dynamo imported (DDP's constructor imports it) the
        # shutdown took about 1 s per rank (0.2 s frozen), and each launch waits for its ranks to end.
        gc.freeze()


def _run_program(spec: RunSpec | ProbeSpec | NodeProbeSpec) -> None:
    # torch: imported after the spec is read, so a refusal costs no import
    if isinstance(spec, ProbeSpec):
        from jobs import fabric

        fabric.main(spec)
    elif isinstance(spec, NodeProbeSpec):
        from jobs import nodeprobe

        nodeprobe.main(spec)
    else:
        from jobs import worker

        worker.main(spec)


class SpecFile:
    """What a backend that pickles its rank program (submitit) submits: the spec file's path, nothing
    else; each rank runs it as ``python -m jobs FILE`` does (:func:`run_file`), so the file the
    backend wrote is what ran."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)

    def __call__(self) -> None:
        run_file(self.path)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m jobs", description="One rank of one cell or probe, from its spec file.",
                    nothing="nothing was run")
    parser.add_argument("spec", help=f"the cell's spec.json, or a probe's {programs.SPEC_FILE}")
    parser.add_argument("--out", help="write the results here, not to the spec's out_dir, and log no MLflow run")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        run_file(args.spec, args.out)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

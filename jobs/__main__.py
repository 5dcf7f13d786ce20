"""One rank of one cell from its spec file, with no pickle: ``python -m jobs SPEC.json [--out DIR]``.

What any launcher can start: under ``torchrun --nproc-per-node N -m jobs spec.json`` (one machine:
the torchrun backend, or a cell reproduced by hand from its reproduce.sh), or ``srun ... python -m
jobs spec.json`` in an allocation. The rank's place comes from the environment its launcher gives
it (jobs/dist.py, the one reader); the spec is the cell's ``spec.json`` (contract/codec.py: the
RunSpec the launcher wrote), and the results land where the submitit path writes them: the spec's
``out_dir`` (result.json, metrics.jsonl, ranks/). ``--out DIR``: write them there instead, and log
no MLflow run (a run by hand never writes over the sweep's figures or its runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from contract.codec import from_plain
from contract.spec import RunSpec


def load(path: str, out_dir: str | None = None) -> RunSpec:
    """The cell's RunSpec from ``path``; with ``out_dir``, redirected there and untracked."""
    try:
        spec = from_plain(RunSpec, json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"python -m jobs {path}: not a readable cell spec ({type(exc).__name__}: {exc}). Fix: give "
                         f"a cell's spec.json from its sweep directory (<sweep>/cells/<cell>/spec.json).") from None
    if out_dir is None:
        return spec
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(spec, out_dir=str(Path(out_dir).resolve()), tracking_uri=None, run_id=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs", description="One rank of one cell, from its spec.json.")
    parser.add_argument("spec", help="the cell's spec.json")
    parser.add_argument("--out", help="write the results here, not to the spec's out_dir, and log no MLflow run")
    args = parser.parse_args(argv)
    spec = load(args.spec, args.out)
    from jobs.worker import main as run_rank  # torch: after the arguments are read

    run_rank(spec)


if __name__ == "__main__":
    main()

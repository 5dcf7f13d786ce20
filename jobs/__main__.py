"""One rank of one cell from its spec file, with no pickle: ``python -m jobs SPEC.json [--out DIR]``.

What any launcher can start: under ``torchrun --nproc-per-node N -m jobs spec.json`` (one machine:
the torchrun backend, or a cell reproduced by hand from its reproduce.sh), or ``srun ... python -m
jobs spec.json`` in an allocation. The rank's place comes from the environment its launcher gives
it (jobs/dist.py, the one reader); the spec is the cell's ``spec.json`` (contract/codec.py: the
RunSpec the launcher wrote), and the results land where the submitit path writes them: the spec's
``out_dir`` (result.json, metrics.jsonl, ranks/). ``--out DIR``: write them there instead, and log
no MLflow run (a run by hand never writes over the sweep's figures or its runs).

The spec is validated when it is read as it was when it was written (RunSpec.validate: the schema's
own checks), so a spec edited by hand (``batch_size: 0``, ``lr: NaN``, an unknown key) is refused
naming the setting before any rank starts. The command line is read as the launcher's commands read
theirs (contract/commandline.py: no abbreviation, a mistyped flag refused naming the closest). Exit
codes: 0 done, 2 refused (docs/troubleshooting.md).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from contract.codec import from_plain
from contract.commandline import USER_ERROR_EXIT, Parser, Refused
from contract.spec import ConfigError, RunSpec

SPEC_FIX = "give a cell's spec.json from its sweep directory (<sweep>/cells/<cell>/spec.json)."


def load(path: str, out_dir: str | None = None) -> RunSpec:
    """The cell's RunSpec from ``path``, validated; with ``out_dir``, redirected there and untracked."""
    try:
        spec = from_plain(RunSpec, json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise Refused(f"python -m jobs {path}: not a readable cell spec ({type(exc).__name__}: {exc}). "
                      f"Fix: {SPEC_FIX}") from None
    try:
        spec.validate()
    except ConfigError as exc:
        raise Refused(f"python -m jobs {path}: a setting of this spec is refused, nothing was run: {exc}") from None
    if out_dir is None:
        return spec
    out = Path(out_dir).resolve()
    sweeps = {Path(spec.out_dir).resolve(), Path(path).resolve().parent}
    if out in sweeps or (out / "spec.json").exists():
        raise Refused(f"--out {out_dir}: {out} is a cell's own directory: its result.json and metrics.jsonl are the "
                      f"sweep's figures, which a run by hand never writes over. Fix: leave --out out (reproduce.sh "
                      f"writes to the cell's reproduced/), or give a directory of its own.")
    out.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(spec, out_dir=str(out), tracking_uri=None, run_id=None)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m jobs", description="One rank of one cell, from its spec.json.",
                    nothing="nothing was run")
    parser.add_argument("spec", help="the cell's spec.json")
    parser.add_argument("--out", help="write the results here, not to the spec's out_dir, and log no MLflow run")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        spec = load(args.spec, args.out)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    from jobs.worker import main as run_rank  # torch: after the arguments are read

    run_rank(spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

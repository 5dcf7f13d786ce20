"""The compile census: what dynamo hands to inductor for each side the GPU check times, counted on
CPU with a trace-only backend, so the GPU's compile path is checked where no GPU is.

    python -m bench.census                        # GPT-2 small and ResNet-50 at their real depth
    python -m bench.census --models resnet50 --sides fsdp --json census.json

For each model and side (the tuned loop of bench/tuned.py, the worker's DDP and FSDP, built by the
worker's own code with ``train.compile`` on), a few steps run with a backend that records each graph
dynamo makes and runs it eagerly (no inductor, no kernels: seconds, not minutes). Counted:

- graphs, and those with dynamic shapes (inductor skips its layout optimisation for them);
- graph breaks, split into those inside the model's own code (a forward cut in two: fails) and
  those elsewhere (DDP's own bookkeeping between the graphs);
- the most graphs one code object holds, against dynamo's recompile limit: within one of it fails
  (one more variant would run eager without a word);
- leaf layers that ran eager, outside every graph (the model's outer layers: fails).

Shapes are small (what dynamo sees does not depend on them, only the steps' cost); depth is real.
Exit status 1 when a side fails a rule, 0 otherwise. One table on stdout; ``--json`` keeps the rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODELS = ("gpt2-small", "resnet50")
SIDES = ("tuned", "ddp", "fsdp")
# Real depth, small shapes: a GPT-2 step of 2 x 64 tokens, a ResNet-50 step of 2 images of 64 x 64.
SHAPES = {"gpt2-small": {"seq_len": 64, "batch_size": 2}, "resnet50": {"image_size": 64, "batch_size": 2}}


@dataclass
class Row:
    model: str
    side: str
    graphs: int = 0
    dynamic_graphs: int = 0
    breaks_in_model: list[str] = field(default_factory=list)
    breaks_elsewhere: int = 0
    most_variants: int = 0
    most_variants_of: str = "-"
    recompile_limit: int = 0
    eager_layers: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    def problems(self) -> list[str]:
        found = []
        if self.error:
            found.append(f"did not run: {self.error}")
        if self.breaks_in_model:
            found.append(f"graph break inside the model's forward at {', '.join(self.breaks_in_model[:3])}")
        if self.recompile_limit and self.most_variants >= self.recompile_limit - 1:
            found.append(f"{self.most_variants_of} holds {self.most_variants} graphs, within one of the recompile "
                         f"limit ({self.recompile_limit})")
        if self.eager_layers:
            found.append(f"{len(self.eager_layers)} layer(s) ran eager: {', '.join(self.eager_layers[:4])}")
        if not self.error and not self.graphs:
            found.append("nothing was compiled")
        return found


class TraceOnly:
    """A dynamo backend that records each graph and runs it as traced (eagerly)."""

    def __init__(self) -> None:
        self.graphs: list[dict[str, Any]] = []

    def __call__(self, gm, example_inputs):
        import torch

        def symbolic(value: Any) -> bool:
            if isinstance(value, torch.SymInt):
                return True
            return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)

        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.graphs.append({"nodes": len(gm.graph.nodes),
                            "dynamic": any(symbolic(n.meta.get("example_value")) for n in placeholders)})
        return gm.forward


class BreakLog(logging.Handler):
    """Where dynamo broke a graph: the ``file:line`` of each break, from its graph-break log."""

    LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"

    def __init__(self) -> None:
        super().__init__()
        self.places: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"Graph break in user code at (\S+):(\d+)", record.getMessage())
        if found:
            self.places.append(f"{found.group(1)}:{found.group(2)}")


class EagerLayers:
    """Leaf layers with parameters whose forward ran outside every compiled graph: a pre-hook that
    records only when dynamo is not tracing it (traced into a graph, the branch folds away)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def watch(self, model) -> None:
        import torch

        for name, module in model.named_modules():
            if next(module.children(), None) is None and next(module.parameters(recurse=False), None) is not None:
                def hook(_module, _args, name=name):
                    if not torch.compiler.is_compiling():
                        self.names.add(name)
                module.register_forward_pre_hook(hook)


def model_files(model) -> set[str]:
    """The source files of the model's own classes (torch's are not the model's code)."""
    import inspect

    files = set()
    for module in model.modules():
        try:
            path = inspect.getsourcefile(type(module))
        except TypeError:
            continue
        if path and f"{os.sep}torch{os.sep}" not in path:
            files.add(os.path.realpath(path))
    return files


def variants(model, extra_codes=()) -> tuple[int, str]:
    """(the most graphs one code object of the model holds, that code's name): every module's
    forward, the model's compiled regions, and ``extra_codes``."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    from jobs.models.init import unwrap

    inner = unwrap(model)
    codes = {type(m).forward.__code__ for m in model.modules()} | set(extra_codes)
    for name in getattr(inner, "compile_regions", ()):
        codes.add(getattr(type(inner), name).__code__)
    best = (0, "-")
    for code in codes:
        n = len(_debug_get_cache_entry_list(code))
        if n > best[0]:
            best = (n, f"{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}")
    return best


def census_side(model: str, side: str, steps: int, env, device, backend: str, control_group, work: Path) -> Row:
    import torch
    from torch._dynamo.utils import counters

    from bench import tuned
    from contract.spec import InputKind, ModelSpec
    from jobs import loss as jobs_loss

    torch._dynamo.reset()
    counters.clear()
    row = Row(model, side, recompile_limit=0)
    shape = SHAPES[model]
    spec = ModelSpec(name=model, input=InputKind.image if model.startswith("resnet") else InputKind.tokens,
                     seq_len=shape.get("seq_len", 1024), vocab_size=50257, image_size=shape.get("image_size", 224))
    counter, eager, breaks = TraceOnly(), EagerLayers(), BreakLog()
    torch._logging.set_logs(graph_breaks=True)
    # Ours alone: the breaks are counted, not printed (torch's own handler would print each in full).
    break_logger = logging.getLogger(BreakLog.LOGGER)
    break_logger.addHandler(breaks)
    break_logger.propagate = False
    t0 = time.perf_counter()
    watched: list[Any] = []
    ranks: list[Any] = []  # the worker side's rank: its heartbeat's thread ends with the side
    try:
        if side == "tuned":
            loop = tuned.TunedLoop(spec, "bf16", shape["batch_size"], device, compile=True, loss="chunked",
                                   backend=counter)
            eager.watch(loop.model)
            watched.append(loop.model)
            loop.run(steps)
            extra = [tuned.TunedLoop._loss.__code__]
        else:
            args = SimpleNamespace(model=model, batch_size=shape["batch_size"], warmup_blocks=1,
                                   worker_set=["train.compile=true"])

            def before(setup, rank) -> None:
                eager.watch(setup.par.model)
                watched.append(setup.par.model)
                ranks.append(rank)

            record, built = tuned.worker_side(args, spec, side, "bf16", env, device, backend, control_group, steps,
                                              work / f"{model}-{side}", compile_backend=counter,
                                              before_first_block=before)
            if built is None:
                raise RuntimeError(record.get("error", "not built").splitlines()[0])
            extra = [jobs_loss.loss_fn.__code__]
        row.most_variants, row.most_variants_of = variants(watched[0], extra)
    except Exception as exc:  # one side's failure is a row, not the end of the census
        row.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        for rank in ranks:
            rank.heartbeat.close("done")
        torch._logging.set_logs(graph_breaks=False)
        break_logger.removeHandler(breaks)
    row.seconds = time.perf_counter() - t0
    config = torch._dynamo.config
    row.recompile_limit = int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))
    row.graphs = len(counter.graphs)
    row.dynamic_graphs = sum(g["dynamic"] for g in counter.graphs)
    files = model_files(watched[0]) if watched else set()
    inside = [p for p in breaks.places if os.path.realpath(p.rsplit(":", 1)[0]) in files]
    row.breaks_in_model = [os.path.relpath(p, REPO) for p in inside]
    row.breaks_elsewhere = len(breaks.places) - len(inside)
    row.eager_layers = sorted(eager.names)
    return row


def table(rows: list[Row]) -> str:
    lines = ["| model | side | graphs | dynamic-shape graphs | graph breaks in the model / elsewhere | most graphs of one "
             "code object (limit) | layers run eager | s | verdict |", "|---|---|---:|---:|---|---|---:|---:|---|"]
    for r in rows:
        problems = r.problems()
        lines.append(f"| {r.model} | {r.side} | {r.graphs} | {r.dynamic_graphs} | {len(r.breaks_in_model)} / "
                     f"{r.breaks_elsewhere} | {r.most_variants} ({r.most_variants_of}; {r.recompile_limit}) | "
                     f"{len(r.eager_layers)} | {r.seconds:.0f} | {'; '.join(problems) or 'pass'} |")
    return "\n".join(lines)


def one_rank_env() -> None:
    """A one-rank process group's variables where no launcher set them (a free port on loopback)."""
    import socket

    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.census", description=__doc__.splitlines()[0],
                                allow_abbrev=False)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    p.add_argument("--steps", type=int, default=2, help="steps per side (the second finds any recompile)")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args(argv)
    models, sides = args.models.split(","), args.sides.split(",")
    for value, known, flag in ((models, MODELS, "--models"), (sides, SIDES, "--sides")):
        unknown = sorted(set(value) - set(known))
        if unknown:
            p.error(f"{flag} {','.join(unknown)}: not one of {', '.join(known)}")
    if args.steps < 2:
        p.error(f"--steps {args.steps}: at least 2 (a recompile shows on the second step)")
    one_rank_env()
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import tempfile

    import torch

    from jobs.dist import DistEnv, backend_for, process_group

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    env = DistEnv.detect(os.environ)
    device = torch.device("cpu")
    rows: list[Row] = []
    with process_group(env, backend_for("cpu"), timeout_s=600, device=None) as control_group, \
            tempfile.TemporaryDirectory(prefix="census-") as work:
        for model in models:
            for side in sides:
                rows.append(census_side(model, side, args.steps, env, device, "gloo", control_group, Path(work)))
                print(f"census: {model} {side}: {rows[-1].graphs} graphs, {'; '.join(rows[-1].problems()) or 'pass'}",
                      file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "problems": r.problems()} for r in rows], indent=1))
    return 1 if any(r.problems() for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The shape of the house: imports flow one way, one module talks to submitit, bench/ uses the
worker's public steps only, sweep directories hold no pickles, the code layout in docs/ names what
exists, and the README stays short with every link of the documents resolving."""

import ast
import subprocess
import sys
from pathlib import Path

from bench import imports as bench_imports

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    """``launcher/report/findings.py`` -> ``launcher.report.findings``; a package's __init__ is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str, run_only: bool = False) -> dict[str, set[str]]:
    """Every module of ``package`` -> the modules of ``package`` it imports, at the top or inside
    functions (``run_only``: those a run imports, not the type checker's under ``if TYPE_CHECKING:``):
    bench/imports.py's graph, the one ``python -m bench.imports chain`` prints."""
    return bench_imports.import_graph(package, ROOT, run_only)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return trail + [node, nxt]
            if nxt not in state:
                found = visit(nxt, trail + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_circles_in_launcher_or_jobs_even_through_function_level_imports():
    for package in ("launcher", "jobs", "contract"):
        assert _cycle(import_graph(package)) is None, _cycle(import_graph(package))


def _commands() -> list[tuple[str, str, str]]:
    """(name, module, entry) of each command in the one list, launcher/commands/__init__.py."""
    from launcher.commands import COMMANDS

    return [(c.name, c.module, c.shim) for c in COMMANDS]


COMMAND_LINES = tuple(module for _, module, _ in _commands())


def _shim_path(entry: str) -> Path:
    """The file ``python -m entry`` runs: a package's __main__.py, else the module itself."""
    package = ROOT.joinpath(*entry.split("."))
    return package / "__main__.py" if package.is_dir() else package.with_suffix(".py")


# The entry shims: what ``python -m launcher[.X]`` runs, each one line that calls its command's main.
ENTRY_SHIMS = tuple(_module_name(_shim_path(entry)) for _, _, entry in _commands())


def _backend_folders() -> list[str]:
    """The backends: each folder of launcher/cluster/ with a backend module."""
    return sorted(p.parent.name for p in (ROOT / "launcher" / "cluster").glob("*/backend.py"))


# The launcher's layers in the order a sweep flows through them: a module imports its own layer and
# the layers before it, never one after it. The commands are the last floor, side by side.
FLOW = [
    # the command -> cells; with it, what composing a grid reads of the backends: their registry and
    # each backend's settings (launcher/cluster/NAME/settings.py)
    ("launcher.plan", "launcher.cluster.registry", *(f"launcher.cluster.{name}.settings" for name in _backend_folders())),
    ("launcher.state", "launcher.masking"),  # the sweep document; the one secret mask
    ("launcher.cluster",),  # cells -> jobs: backends, submission, failures, co-location
    ("launcher.track",),  # jobs -> MLflow runs, each cell's state
    ("launcher.report",),  # runs -> rows, findings, the report
    ("launcher.forecast",),  # the performance model, its inputs, its record, the fabric's reading
    ("launcher.decide",),  # runs=auto: the comparisons still open -> the next round's cells
    ("launcher.finish",),  # a sweep's finish, which every command reaches
    ("launcher.preflight", "launcher.preview", "launcher.probe", "launcher.healthprobe",
     "launcher.sweep"),  # what two commands share: the checks, --plan, the probes, a sweep's life
    ("launcher.commands", *ENTRY_SHIMS),  # the commands side by side on their base, and their entry shims
]


def _layer(module: str) -> int:
    """The layer of the longest name in FLOW that holds ``module``: the report's entry shim
    (launcher/report/__main__.py) is on the commands' floor, the rest of launcher.report is not."""
    places = [(len(n), i) for i, names in enumerate(FLOW) for n in names
              if module == n or module.startswith(n + ".")]
    return max(places)[1]


def test_the_launcher_imports_flow_one_way_plan_cluster_track_report():
    graph = import_graph("launcher")
    unplaced = [m for m in graph if not any(m == n or m.startswith(n + ".") for names in FLOW for n in names)]
    assert not unplaced, f"place {unplaced} in FLOW"
    upward = [(m, i) for m, imported in graph.items() for i in sorted(imported) if _layer(i) > _layer(m)]
    assert not upward, upward


# The commands reach the report through the finish (launcher/finish.py), never through the report's
# module or its command.
THROUGH_THE_FINISH = ("launcher.commands.status", "launcher.sweep", "launcher.commands.sync")


def _top_level(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text()).body


def test_the_commands_are_one_list_each_on_the_one_base():
    """Every module of launcher/commands/ (but the list and the base, command.py) is a command of the one list,
    each a subclass of base.Command named as the list names it, whose ``main`` is its class's."""
    modules = {_module_name(p) for p in (ROOT / "launcher" / "commands").glob("*.py")}
    assert modules - {"launcher.commands", "launcher.commands.command"} == set(COMMAND_LINES)
    for name, module, _ in _commands():
        body = _top_level(ROOT.joinpath(*module.split(".")).with_suffix(".py"))
        classes = {n.name: n for n in body if isinstance(n, ast.ClassDef)
                   and any(ast.unparse(b) == "Command" for b in n.bases)}
        named = [c for c, node in classes.items() if any(
            isinstance(s, ast.Assign) and ast.unparse(s) == f"name = {name!r}" for s in node.body)]
        assert len(named) == 1, f"{module}: one Command subclass with name = {name!r}, found {sorted(classes)}"
        assert any(isinstance(n, ast.Assign) and ast.unparse(n) == f"main = {named[0]}.main" for n in body), module


def test_each_entry_shim_only_calls_its_commands_main():
    """``python -m launcher`` and ``python -m launcher.X`` keep working through a shim of one line;
    no other module of the launcher is a command (a ``main`` run under ``if __name__ == "__main__":``;
    finish's block is the background settler a command starts, launcher/cluster/slurm/ranks.py's hands
    a rank to jobs' own ``main``)."""
    for name, _, entry in _commands():
        body = [n for n in _top_level(_shim_path(entry)) if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        said = [ast.unparse(n) for n in body]
        assert said == ["from launcher.commands import main_of", f"main = main_of({name!r})",
                        "if __name__ == '__main__':\n    raise SystemExit(main())"], (entry, said)
    blocks = sorted(_module_name(p) for p in (ROOT / "launcher").rglob("*.py") for n in _top_level(p)
                    if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'")
    assert set(blocks) == {*ENTRY_SHIMS, "launcher.finish", "launcher.cluster.slurm.ranks"}, blocks
    defining = sorted(_module_name(p) for p in (ROOT / "launcher").rglob("*.py") for n in _top_level(p)
                      if isinstance(n, ast.FunctionDef) and n.name == "main")
    assert not defining, f"{defining} define a main(): a command is a class in launcher/commands/, in its one list"


def test_no_module_but_the_entry_shims_imports_a_command():
    """The library never imports a command (what two commands share moves a floor down: finish,
    forecast/cells.py, track/runs.py); the commands import none of each other, only their base."""
    found = {}
    for package in ("launcher", "jobs", "contract", "bench"):
        for path in (ROOT / package).rglob("*.py"):
            module = _module_name(path)
            if module.startswith("launcher.commands") or module in ENTRY_SHIMS:
                continue
            names = [a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)]
            names += [f"{n.module}.{a.name}" for n in ast.walk(ast.parse(path.read_text()))
                      if isinstance(n, ast.ImportFrom) and n.module == "launcher" for a in n.names]
            used = sorted(n for n in names if n == "launcher.commands" or n.startswith("launcher.commands."))
            if used:
                found[module] = used
    assert not found, f"{found}: move what they need out of the command, a floor down"
    graph = import_graph("launcher")
    between = {m: sorted(graph[m] & set(COMMAND_LINES)) for m in COMMAND_LINES if graph[m] & set(COMMAND_LINES)}
    assert not between, f"{between}: move what they share a floor down (launcher/finish.py, launcher/forecast/cells.py)"


def _refusal_cases() -> dict[str, int]:
    """Command name -> the refusal cases tests/test_refusals.py holds of it: the rows of its corpora
    (module-level lists named ``...CORPUS``) that name the command, as the one list names it, in one
    of their first two fields."""
    names = {name for name, _, _ in _commands()}
    counts = dict.fromkeys(names, 0)
    for node in _top_level(ROOT / "tests" / "test_refusals.py"):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
                and any(isinstance(t, ast.Name) and t.id.endswith("CORPUS") for t in node.targets)):
            continue
        for row in node.value.elts:
            heads = row.elts[:2] if isinstance(row, ast.Tuple) else []
            for head in heads:
                if isinstance(head, ast.Constant) and head.value in names:
                    counts[head.value] += 1
                    break
    return counts


def test_every_command_has_refusal_cases():
    """A command in the one list with no case in tests/test_refusals.py fails here: each command ships
    its hostile input (exit code, the setting named, no traceback, nothing created or lost)."""
    counts = _refusal_cases()
    assert not [n for n, k in counts.items() if not k], f"commands without a refusal case: {counts}"


def test_status_sweep_and_sync_do_not_import_the_report_module():
    graph = import_graph("launcher")
    found = {m: sorted(graph[m] & {"launcher.report.markdown", "launcher.commands.report"}) for m in THROUGH_THE_FINISH}
    assert not any(found.values()), found
    assert all("launcher.finish" in graph[m] for m in THROUGH_THE_FINISH)


def test_the_launchers_longest_import_chain_is_at_most_10_modules():
    """Imports inside functions count; those under ``if TYPE_CHECKING:`` never run, and do not."""
    chain = bench_imports.longest_chain("launcher", ROOT)
    assert len(chain) <= 10, f"{len(chain)} modules: {' -> '.join(chain)}"


def test_the_jobs_longest_import_chain_is_at_most_10_modules():
    """The ranks' side is held as the launcher is: imports inside functions count."""
    chain = bench_imports.longest_chain("jobs", ROOT)
    assert len(chain) <= 10, f"{len(chain)} modules: {' -> '.join(chain)}"


def test_the_longest_import_chain_across_launcher_jobs_and_contract_is_at_most_14_modules():
    """A chain that leaves the launcher for the contract or the ranks' side (the fit's meta-device
    model, the schema's parts) counts every module it passes."""
    chain = bench_imports.longest_chain(("launcher", "jobs", "contract"), ROOT)
    assert len(chain) <= 14, f"{len(chain)} modules: {' -> '.join(chain)}"


def test_no_module_of_launcher_jobs_or_contract_is_over_450_lines_and_the_worker_at_most_350():
    """A module that grows past this holds more than one concern: split it by concern. The worker is
    orchestration only (jobs/worker.py: named steps), held tighter."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
             for d in ("launcher", "jobs", "contract") for p in (ROOT / d).rglob("*.py")}
    assert not {path: n for path, n in sizes.items() if n > 450}, {path: n for path, n in sizes.items() if n > 450}
    assert sizes["jobs/worker.py"] <= 350, sizes["jobs/worker.py"]


def test_jobs_never_imports_the_launcher_hydra_or_omegaconf():
    for path in (ROOT / "jobs").rglob("*.py"):
        text = path.read_text()
        for banned in ("import launcher", "from launcher", "import hydra", "from hydra", "omegaconf"):
            assert banned not in text, f"{path.relative_to(ROOT)} uses {banned}"


# What the launcher may import from jobs, and why. What both sides must read alike is the contract
# (contract/); anything else of jobs belongs to the ranks. (jobs.models, jobs.models.checks and jobs.loss
# are imported inside preflight's and the fit's functions only, before launch: never at start-up.)
LAUNCHER_USES_OF_JOBS = {
    "jobs": "its files, hashed into the fit cache's key",
    "jobs.__main__": "the entry every rank program starts from, its spec file: what submitit pickles (SpecFile), "
                     "and one cell's rank by hand under srun once Slurm's variables are translated",
    "jobs.models": "building a model on the meta device before launch (preflight's fit)",
    "jobs.models.checks": "refusing, before launch, a model the ranks could not build (preflight)",
    "jobs.loss": "the loss a cell trains with, for the activation estimate before launch",
}


def test_the_contract_imports_neither_side_nor_torch():
    """contract/ is what launcher and worker share: it imports neither of them, nor torch, Hydra or
    OmegaConf, so the launcher starts without torch and the ranks without config machinery."""
    for path in (ROOT / "contract").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            tops = {n.split(".")[0] for n in names}
            assert not tops & {"jobs", "launcher", "torch", "hydra", "omegaconf", "numpy"}, (path, tops)
    modules = sorted(_module_name(p) for p in (ROOT / "contract").rglob("*.py"))
    blocked = "import sys; sys.modules.update(dict.fromkeys(['torch', 'hydra', 'omegaconf', 'numpy']))"
    done = subprocess.run([sys.executable, "-c", f"{blocked}; import " + ", ".join(modules)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_launcher_imports_only_the_contract_from_jobs():
    modules = {_module_name(p) for p in (ROOT / "jobs").rglob("*.py")}
    used: dict[str, set[str]] = {}
    for path in (ROOT / "launcher").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                      for a in node.names] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                if name == "jobs" or name.startswith("jobs."):
                    used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    unlisted = {m: sorted(p) for m, p in used.items() if m not in LAUNCHER_USES_OF_JOBS}
    assert not unlisted, f"the launcher imports {unlisted} from jobs: say why in LAUNCHER_USES_OF_JOBS, or move it"
    assert set(LAUNCHER_USES_OF_JOBS) <= set(used), set(LAUNCHER_USES_OF_JOBS) - set(used)


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.split(".")[0] for node in ast.walk(tree)
            for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                      [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}


def test_submitit_is_used_by_the_backends_submission_modules_only():
    """submitit is the backends' tool, each in its own folder's submit module: nothing else in the
    launcher imports it."""
    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "launcher").rglob("*.py") if "submitit" in _imported_roots(p))
    allowed = {f"launcher/cluster/{b}/submit.py" for b in _backend_folders()}
    assert users and not set(users) - allowed, users
    assert {"launcher/cluster/slurm/submit.py", "launcher/cluster/local/submit.py"} <= set(users)


def test_one_submission_path():
    """Every run, resume and resubmission of cells goes through ``Backend.submit``: a backend's
    submission module is imported by its own folder only, and ``_start`` (which hands cells to it) is
    called by ``Backend.submit`` alone."""
    graph = import_graph("launcher")
    for backend in _backend_folders():
        submit = f"launcher.cluster.{backend}.submit"
        outside = sorted(m for m, imported in graph.items()
                         if submit in imported and not m.startswith(f"launcher.cluster.{backend}."))
        assert not outside, f"{outside} import {submit}: submit through Backend.submit (launcher/cluster/base.py)"
    callers = sorted(f"{p.relative_to(ROOT)}:{node.lineno}" for p in (ROOT / "launcher").rglob("*.py")
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_start")
    assert len(callers) == 1 and callers[0].startswith("launcher/cluster/base.py:"), callers


def test_a_backend_is_a_folder_and_one_registry_line():
    """The registry (launcher/cluster/backends.py) names exactly the backend folders, each by its name,
    and imports none of them until asked (the report and decide never import Slurm's)."""
    import subprocess
    import sys

    from launcher.cluster.backends import backend_class
    from launcher.cluster.registry import BACKENDS
    from launcher.plan.clusterschema import settings_class

    assert sorted(BACKENDS) == _backend_folders()
    for name in BACKENDS:  # its classes in its folder, and its conf file composing its settings
        assert backend_class(name).__module__ == f"launcher.cluster.{name}.backend" and backend_class(name).name == name
        assert settings_class(name).__module__ == f"launcher.cluster.{name}.settings" and settings_class(name).name == name
        assert f"- {name}_schema" in (ROOT / "launcher" / "conf" / "cluster" / f"{name}.yaml").read_text()
    probe = ("import sys, launcher.cluster.backends, launcher.report.collect, launcher.report.markdown, launcher.decide; "
             "print(sorted(m for m in sys.modules if m.startswith('launcher.cluster.') and m.endswith('.backend')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert loaded.stdout.strip() == "[]", loaded.stdout


BACKEND_NAMES = set(_backend_folders())


def _backend_comparisons(path: Path) -> list[int]:
    """Lines of ``path`` that compare something with a backend's name or kind (==, !=, in, is, ...)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
            if any(isinstance(n, ast.Constant) and n.value in BACKEND_NAMES for n in names):
                lines.append(node.lineno)
    return lines


def test_only_the_backend_modules_compare_backend_names():
    """What differs between clusters is asked of the backend (launcher/cluster/base.py), never decided
    by comparing ``state.cluster`` with a name (the ranks' side, jobs/, compares none: what a
    backend's ranks need is in the variables it gives them, contract/rank_env.py). What a backend reads and refuses is its settings class's (launcher/cluster/NAME/settings.py)."""
    assert {"slurm", "local"} <= BACKEND_NAMES
    backends = {p for name in BACKEND_NAMES for p in (ROOT / "launcher" / "cluster" / name).rglob("*.py")}
    backends |= {ROOT / "launcher" / "cluster" / "registry.py"}
    found = {str(p.relative_to(ROOT)): _backend_comparisons(p) for p in (ROOT / "launcher").rglob("*.py")
             if p not in backends}
    assert not {path: lines for path, lines in found.items() if lines}


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _jobs_module_names() -> set[str]:
    """``jobs`` and the name of each of its modules and packages, as bench/ may import them."""
    return {"jobs"} | {p.stem for p in (ROOT / "jobs").glob("*.py")} | {
        p.name for p in (ROOT / "jobs").iterdir() if (p / "__init__.py").exists()}


def test_one_record_per_cell():
    """A cell is one class from planning to its last status (launcher/plan/cell.py): no other class in
    the launcher declares a cell's name and directory, so there is no second record to convert into."""
    declaring = sorted(f"{path.relative_to(ROOT)}:{node.name}" for path in (ROOT / "launcher").rglob("*.py")
                       for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
                       and {"name", "dirname"} <= {s.target.id for s in node.body
                                                   if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)})
    assert declaring == ["launcher/plan/cell.py:Cell"], declaring


def test_bench_uses_no_private_name_of_jobs():
    jobs_modules = _jobs_module_names()
    for path in (ROOT / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jobs"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(ROOT)} imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                # jobs.sinks.MlflowSink._x or worker._x: any chain that starts at jobs or one of its modules
                assert _root(node) not in jobs_modules, f"{path.relative_to(ROOT)} uses .{node.attr} of jobs/"


def _names_bound_to_jobs(tree: ast.AST) -> set[str]:
    """Names a module binds to jobs/ or to anything imported from it: ``import jobs.x`` binds
    ``jobs``, ``import jobs.x as y`` binds ``y``, ``from jobs.x import A as B`` binds ``B``."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names
                         if a.name == "jobs" or a.name.startswith("jobs."))
        elif isinstance(node, ast.ImportFrom) and (node.module == "jobs" or (node.module or "").startswith("jobs.")):
            bound.update(a.asname or a.name for a in node.names)
    return bound


def _assigned_attributes_of(tree: ast.AST, bound: set[str]) -> list[str]:
    """Attribute chains rooted at a name in ``bound`` that ``tree`` assigns (``x.y = ...``,
    ``x.y += ...``, ``setattr(x.y, ...)``, ``delattr(x, ...)``), as source text."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("setattr", "delattr") and node.args):
            first = node.args[0]
            if isinstance(first, (ast.Name, ast.Attribute)) and _root(first) in bound:
                found.append(ast.unparse(node))
            continue
        found += [ast.unparse(t) for t in targets if isinstance(t, ast.Attribute) and _root(t) in bound]
    return found


def test_bench_assigns_no_attribute_of_jobs():
    """bench/ times the worker through its public hooks (jobs/hooks.py), never by replacing what a
    module or class of jobs/ holds: what it measures is the worker as it ships."""
    for path in (ROOT / "bench").rglob("*.py"):
        tree = ast.parse(path.read_text())
        bound = _names_bound_to_jobs(tree) | {"jobs"}
        assigned = _assigned_attributes_of(tree, bound)
        assert not assigned, f"{path.relative_to(ROOT)} assigns {assigned}"


def test_the_assignment_check_sees_every_form():
    source = """
import jobs.loop
import jobs.sinks as s
from jobs import comm
from jobs.sinks import FanOut as F
jobs.loop.Trainer.step = 1
s.MlflowSink.client = 2
comm.probe += 3
F.finish: int = 4
setattr(F, "log_steps", 5)
delattr(comm, "probe")
local = object()
local.x = 6
"""
    tree = ast.parse(source)
    assert _assigned_attributes_of(tree, _names_bound_to_jobs(tree)) == [
        "jobs.loop.Trainer.step", "s.MlflowSink.client", "comm.probe", "F.finish", "setattr(F, 'log_steps', 5)",
        "delattr(comm, 'probe')"]


def _layout_section() -> str:
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    return architecture.split("## Layout of the code\n", 1)[1].split("\n## ", 1)[0]


def test_the_code_layout_names_every_module_and_only_what_exists():
    """The code layout (docs/architecture.md) cannot drift: every module of launcher/, contract/ and jobs/ (and
    every script) is named in its directory's entry, each package of launcher/ and jobs/ has an entry of its own
    that names its modules (packages inside packages too: launcher/cluster/slurm/), and every path the
    section names exists."""
    import re

    section = _layout_section()
    entries = dict(re.findall(r"^    (\S+/)\s+(.*(?:\n {21}.*)*)", section, flags=re.M))
    packages = [*(ROOT / "launcher").rglob("*/__init__.py"), *(ROOT / "jobs").rglob("*/__init__.py")]
    folders = ["launcher", "contract", "jobs"] + [str(p.parent.relative_to(ROOT)) for p in packages]
    for folder in folders:
        assert f"{folder}/" in entries, f"the code layout has no entry for {folder}/"
        text = entries[f"{folder}/"]
        modules = [p.stem for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"]
        modules += [p.name for p in (ROOT / folder).iterdir() if p.is_dir() and (p / "__init__.py").exists()]
        missing = [m for m in modules if not re.search(rf"(?<![\w/]){re.escape(m)}\b", text)]
        assert not missing, f"the code layout does not name {folder}/{missing}"
    scripts = [p.name for p in (ROOT / "scripts").iterdir() if p.is_file()]
    assert not [s for s in scripts if s not in entries["scripts/"]], entries["scripts/"]
    for path in re.findall(r"\b[\w.-]+/[\w./-]*", section):
        if path.startswith(("launcher/", "contract/", "jobs/", "scripts/", "slurm/", "docker/", "bench/", "tests/")):
            assert (ROOT / path.rstrip("/")).exists(), f"the code layout names {path}, which does not exist"


_LINK = r"\]\(([^)\s]+)\)"


def _heading_ids(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to -."""
    import re

    titles = re.findall(r"^#{1,6} +(.+?) *$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in titles}


def _broken_links(doc: Path) -> list[str]:
    """The relative links of ``doc`` whose file, or heading in that file, does not exist."""
    import re

    broken = []
    for target in re.findall(_LINK, doc.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _heading_ids(dest)):
            broken.append(target)
    return broken


def test_the_readme_is_short_and_maps_every_document():
    """The README is the short way in (at most 250 lines); the details live under docs/, every
    document there is linked from it, and each of its links to docs/ resolves, heading included."""
    import re

    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= 250, f"README.md has {len(text.splitlines())} lines: details belong in docs/"
    linked = {t.partition("#")[0] for t in re.findall(_LINK, text) if t.startswith("docs/")}
    documents = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")} | {"docs/gpu/README.md"}
    assert not documents - linked, f"README.md does not link {sorted(documents - linked)}"
    assert not [t for t in _broken_links(readme) if t.startswith("docs/")], _broken_links(readme)


def test_the_documents_links_resolve():
    docs = [ROOT / "README.md", ROOT / "docs" / "gpu" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    docs += [ROOT / d / "README.md" for d in ("slurm", "docker", "bench")]
    broken = {str(d.relative_to(ROOT)): _broken_links(d) for d in docs}
    assert not any(broken.values()), {d: links for d, links in broken.items() if links}


def _string_constants(path: Path) -> set[str]:
    """Every string a module writes as a literal (docstrings are whole sentences, never a bare name),
    except the function names its ``__all__`` lists."""
    tree = ast.parse(path.read_text())
    exported = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets) for n in ast.walk(node.value)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in exported}


def test_a_metrics_name_is_written_in_at_most_two_modules():
    """The registry (contract/metrics.py) names each metric once; the code that measures it may write it
    too; every other module reads it from the registry. Names that are also a setting of the schema or
    a cell's size (nodes, runs, world_size, lr) are the config's words as well, and are not counted."""
    from contract import metrics
    from launcher.plan.schemakeys import schema_keys

    settings = {k.rsplit(".", 1)[-1] for k in schema_keys()} | {"world_size"}
    written = {str(p.relative_to(ROOT)): _string_constants(p)
               for d in ("launcher", "jobs", "contract") for p in (ROOT / d).rglob("*.py")}
    over = {m.name: sorted(f for f, names in written.items() if m.name in names)
            for m in (*metrics.METRICS, *metrics.STEP_SERIES) if m.name not in settings}
    assert not {n: f for n, f in over.items() if len(f) > 2}, {n: f for n, f in over.items() if len(f) > 2}


# Names two modules may share: the same concern at two layers, where the layer says which.
LAYERED_NAMES = {
    "fabric": "the fabric probe: its spec (contract/), its run on the ranks (jobs/), its reading (launcher/forecast/)",
    "health": "the node health probe: its spec (contract/), its command (launcher/commands/), its verdicts "
              "(launcher/report/)",
    "history": "series over time: the command (launcher/commands/) and the analysis (launcher/report/)",
    "parallel": "the parallel layout: the value (contract/) and its application to a model (jobs/)",
    "stats": "statistics: of one run (contract/) and between runs (launcher/report/)",
}


def test_no_two_modules_share_a_name_unless_the_layer_says_which():
    """A module's name says which concern it holds: two modules of launcher/, jobs/ and contract/ with
    one name hold the same concern at two layers (LAYERED_NAMES), or are a package's __init__ and
    __main__, or the same part of two backends (launcher/cluster/<backend>/), or a command and its entry
    shim (launcher/commands/status.py and launcher/status.py)."""
    backends = ROOT / "launcher" / "cluster"
    where: dict[str, list[str]] = {}
    for d in ("launcher", "jobs", "contract"):
        for p in (ROOT / d).rglob("*.py"):
            if p.stem in ("__init__", "__main__") or p.parent.parent == backends or _module_name(p) in ENTRY_SHIMS:
                continue
            where.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    shared = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    assert set(shared) == set(LAYERED_NAMES), {n: p for n, p in shared.items() if n not in LAYERED_NAMES}

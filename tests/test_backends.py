"""The backends' interface as written and as built: docs/backends.md names every abstract method of
``Backend`` (a backend written from that page instantiates), no backend subclasses another, node
settings are rewritten by their backend alone, and a probe starts from its spec file through
``python -m jobs``' entry (the torchrun backend's from its command line; Slurm's from a pickle of the
file's path alone)."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from launcher.cluster.backends import backend_class, backend_for
from launcher.cluster.base import Backend
from launcher.cluster.registry import BACKENDS
from launcher.plan.clusterschema import ClusterConfig, settings_class

ROOT = Path(__file__).resolve().parent.parent


def test_the_backends_page_names_every_abstract_method_of_the_interface():
    doc = (ROOT / "docs" / "backends.md").read_text()
    abstract = sorted(Backend.__abstractmethods__)
    assert {"start_probe", "nodes_fingerprint", "excluding", "placing_apart"} <= set(abstract)
    missing = [name for name in abstract if not re.search(rf"`{re.escape(name)}\(", doc)]
    assert not missing, f"docs/backends.md does not name {missing}, abstract in launcher/cluster/base.py"
    for name in abstract:  # each with the parameters the method takes, as the page writes its call
        params = [p for p in inspect.signature(getattr(Backend, name)).parameters if p != "self"]
        assert f"`{name}({', '.join(params)})`" in doc, (name, params)


def test_no_backend_subclasses_another():
    """What backends share is a module of its own (launcher/cluster/onemachine.py), never another
    backend's class: the settings likewise subclass ClusterConfig alone."""
    backends = {name: backend_class(name) for name in BACKENDS}
    settings = {name: settings_class(name) for name in BACKENDS}
    for name in BACKENDS:
        others = {n for n in BACKENDS if n != name}
        assert not [n for n in others if issubclass(backends[name], backends[n])], name
        assert not [n for n in others if issubclass(settings[name], settings[n])], name
        assert settings[name].__bases__ == (ClusterConfig,), settings[name].__bases__


def _cell(cluster: ClusterConfig, name: str = "strategy=ddp run=2", placed: str | None = None):
    from contract.spec import Layout
    from launcher.plan.cell import Cell

    return Cell(index=1, name=name, dirname="01", overrides=[], strategy="ddp", precision="fp32", model="m",
                cluster=cluster, layout=Layout(nodes=1), placed=placed)


def test_the_slurm_backend_alone_rewrites_its_node_lists():
    """health=auto's slow nodes join the user's exclude and drop a placement on one of them; a later run
    is placed away from the nodes its grid point used (launcher/cluster/slurm/spread.py); the cell
    gets a settings object of its own, and one machine's backends place nothing."""
    from launcher.cluster.slurm.settings import SlurmSettings

    slurm = backend_for("slurm")
    shared = SlurmSettings(partition="gpu", exclude="node9", nodelist="node2")
    cell = _cell(shared, placed="nodelist=node2")
    slurm.excluding(cell, ["node2", "node3"])
    assert (cell.cluster.exclude, cell.cluster.nodelist, cell.placed) == ("node9,node2,node3", None, None)
    assert shared.exclude == "node9" and shared.nodelist == "node2"  # the grid point's other runs keep theirs
    later = _cell(SlurmSettings(nodelist="node1"), placed="nodelist=node1")  # copied from run 1
    slurm.placing_apart(later, {"node1"}, {"node1", "node2", "node3"})
    assert (later.cluster.nodelist, later.cluster.exclude, later.placed) == (None, "node1", "exclude=node1")
    own = _cell(SlurmSettings(nodelist="node7"))  # the user's own placement stays
    slurm.placing_apart(own, {"node7"}, {"node1", "node7"})
    assert (own.cluster.nodelist, own.placed) == ("node7", None)
    for name in ("local", "torchrun"):
        here = _cell(settings_class(name)(), placed="nodelist=node1")
        backend_for(name).placing_apart(here, {"a"}, {"a", "b"})
        backend_for(name).excluding(here, ["a"])
        assert here.placed is None and here.cluster == settings_class(name)()


def test_the_torchrun_backend_runs_the_node_probe_from_its_spec_file(tmp_path, capsys):
    """Two nodes emulated on this machine under one torchrun, started as ``python -m jobs
    probe-spec.json`` (contract/programs.py): regrouped into two nodes, each measured, no pickle."""
    from launcher import health as command

    code = command.main(["cluster=torchrun", "health.nodes=2", "health.repeats=1", "health.dcgm=false",
                         "tracking.enabled=false", f"output_root={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0, out
    (spec_file,) = tmp_path.glob("health/*/job0/submitit/probe-spec.json")
    assert json.loads(spec_file.read_text())["program"] == "nodeprobe"
    assert not list(tmp_path.rglob("*.pkl"))
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("health/*/record.json")]
    assert len(record["nodes"]) == 2 and len(record["pairs"]) == 1, record
    assert all(v > 0 for n in record["nodes"].values() for v in n["figures"].values())


def test_what_slurm_pickles_is_a_spec_files_path_that_each_task_runs_as_python_m_jobs(tmp_path):
    """What the Slurm backend gives submitit is the spec file's path alone (pickled as submitit does,
    with cloudpickle); each task unpickles it and, its Slurm variables translated (OnSlurm), runs
    the fabric probe from the file. Two real tasks on gloo, as a job's would be, without Slurm (under
    sbatch: tests/test_slurm.py)."""
    import os
    import random
    import socket
    import subprocess
    import sys

    import cloudpickle

    from contract import programs
    from contract.fabric import RESULT_FILE, ProbeSpec
    from contract.rendezvous import port_for_job
    from contract.spec import Layout
    from launcher.cluster.slurm import submit

    spec = ProbeSpec(out_dir=str(tmp_path / "fabric"), layout=Layout(nodes=1, tasks_per_node=2, cpus_per_task=1),
                     sizes_bytes=[1024, 64 * 1024], iters=2, warmup_iters=1, collective_timeout_s=60)
    path = programs.write(tmp_path / "fabric", spec)
    pickled = cloudpickle.dumps(submit.from_spec_file(path))
    assert str(path).encode() in pickled and b"sizes_bytes" not in pickled  # the path, not the spec
    (tmp_path / "job.pkl").write_bytes(pickled)

    def port_free(job_id: str) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port_for_job(job_id))) != 0

    job_id = next(j for j in (str(random.randrange(10**6, 10**7)) for _ in range(100)) if port_free(j))
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    tasks = [subprocess.Popen([sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))()",
                               str(tmp_path / "job.pkl")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**clean, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
                                   "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_ID": job_id,
                                   "SLURM_JOB_NODELIST": "localhost"})
             for rank in range(2)]
    outputs = [task.communicate(timeout=180)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs
    result = json.loads((tmp_path / "fabric" / RESULT_FILE).read_text())
    assert {p["ranks"] for p in result["points"]} == {2} and result["fits"]

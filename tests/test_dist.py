"""The rank-layout reader over tables of environment variables."""

import socket
import threading
import time

import pytest

from contract.rendezvous import PORT_BASE, PORT_SPAN, port_for_job
from jobs.__main__ import emulated_nodes
from jobs.dist import DistEnv, check_port_free
from launcher.cluster.local.ranks import torchrun_env as local_env
from launcher.cluster.slurm.nodelist import expand_nodelist
from launcher.cluster.slurm.ranks import torchrun_env


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("gpu-a[01-03]", ["gpu-a01", "gpu-a02", "gpu-a03"]),
        ("n1,n2", ["n1", "n2"]),
        ("a[1-2],b[9-10]", ["a1", "a2", "b9", "b10"]),
        ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


SLURM = {
    "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
    "SLURM_JOB_NODELIST": "node[1-3,7]", "SLURM_NNODES": "4", "SLURM_JOB_ID": "12345",
    "SLURMD_NODENAME": "node3",
}
TORCHRUN = {
    "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "abc",
}
LOCAL = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "3", "SUBMITIT_LOCAL_LOCALID": "3",
         "SUBMITIT_LOCAL_NTASKS": "4", "SUBMITIT_LOCAL_JOB_ID": "777"}


@pytest.mark.parametrize(
    "environ, emulate, expected",
    [
        # A Slurm task's variables as its backend translates them (jobs/ reads no SLURM_*).
        (torchrun_env(SLURM), None, dict(rank=5, world_size=8, local_rank=1, node_rank=2, num_nodes=4,
                                         local_world_size=2, master_addr="node1", master_port=port_for_job("12345"),
                                         source="slurm", hostname="node3", job_id="12345",
                                         requeue_command="scontrol requeue 12345")),
        (SLURM, None, dict(rank=0, world_size=1, source="single")),  # untranslated: not read
        (TORCHRUN, None, dict(rank=3, world_size=4, local_rank=1, node_rank=1, num_nodes=2, master_addr="10.0.0.1",
                              master_port=29400, source="torchrun")),
        # torchrun inside a Slurm allocation: torchrun decided the layout.
        ({**SLURM, **TORCHRUN}, None, dict(rank=3, world_size=4, source="torchrun", requeue_command="")),
        # ... regrouped by python -m jobs into emulated nodes of 2 ranks (a spec with emulate_nodes)
        ({**local_env(LOCAL), **emulated_nodes(local_env(LOCAL), 2)}, None, dict(rank=3, world_size=4, local_rank=1, node_rank=1, num_nodes=2, local_world_size=2,
                        master_addr="127.0.0.1", master_port=port_for_job("777"), source="submitit-local")),
        (local_env(LOCAL), None, dict(rank=3, local_rank=3, node_rank=0, num_nodes=1)),
        (LOCAL, None, dict(rank=0, world_size=1, source="single")),  # untranslated: not read
        ({}, None, dict(rank=0, world_size=1, local_rank=0, node_rank=0, num_nodes=1, source="single")),
    ],
)
def test_detect(environ, emulate, expected):
    env = DistEnv.detect(environ)
    for key, value in expected.items():
        assert getattr(env, key) == value, key


def test_an_array_task_requeues_alone():
    env = torchrun_env({**SLURM, "SLURM_ARRAY_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "4", "SLURM_JOB_ID": "130"})
    assert env["DDP_BENCH_REQUEUE"] == "scontrol requeue 123_4" and env["DDP_BENCH_JOB_ID"] == "130"
    assert torchrun_env(TORCHRUN) == {}  # not a Slurm task: nothing to translate


def test_ports_differ_for_concurrent_jobs_and_avoid_ephemeral_range():
    ports = {port_for_job(str(j)) for j in range(1000, 1000 + PORT_SPAN)}
    assert len(ports) == PORT_SPAN
    assert min(ports) >= PORT_BASE and max(ports) < 32768  # below Linux's ephemeral ports
    # Array task ids such as 123_4 use their own SLURM_JOB_ID; the helper still accepts them.
    assert port_for_job("123_4") != port_for_job("123_5")


def _port_in_time_wait() -> int:
    """A port whose listener closed its accepted connection first, as a finished TCPStore does: the
    port is left in TIME_WAIT, which is what a requeued job (same job id, same port) finds."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: TIME_WAIT lands on its port
    server.close()
    client.close()
    with socket.socket() as plain:  # the situation is real: a plain bind is refused
        with pytest.raises(OSError):
            plain.bind(("", port))
    return port


def test_port_check_accepts_a_port_left_in_time_wait_by_a_previous_run():
    check_port_free(_port_in_time_wait(), wait_s=0)


def test_port_check_refuses_a_live_listener_after_waiting():
    with socket.socket() as other_job:
        other_job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other_job.bind(("", 0))
        other_job.listen()
        port = other_job.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=f"MASTER_PORT {port} is already in use"):
            check_port_free(port, wait_s=1.0)
        assert time.monotonic() - t0 >= 1.0


def test_port_check_waits_for_a_listener_that_goes_away():
    other_job = socket.socket()
    other_job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other_job.bind(("", 0))
    other_job.listen()
    port = other_job.getsockname()[1]
    threading.Timer(0.5, other_job.close).start()  # the previous run's head rank exiting
    check_port_free(port, wait_s=10.0)


def test_the_cuda_device_is_bound_to_the_process_group_only_where_device_mesh_can_split_it():
    """Before torch 2.9 a bound device makes every 2-D mesh assert on the "cpu:gloo,cuda:nccl"
    group (pytorch#159200): bind from 2.9 on, never on CPU ranks."""
    import torch

    from jobs.dist import bound_device

    cuda = torch.device("cuda", 3)
    assert bound_device(cuda, "2.6.0+cu124") == {} and bound_device(cuda, "2.8.0") == {}
    assert bound_device(cuda, "2.9.1") == {"device_id": cuda} and bound_device(cuda, "2.13.0+cpu") == {"device_id": cuda}
    assert bound_device(torch.device("cpu"), "2.13.0") == {} and bound_device(None, "2.13.0") == {}

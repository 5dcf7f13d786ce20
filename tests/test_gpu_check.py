"""The GPU check rehearsed on CPU (scripts/gpu-check --cpu), as an offline GPU node would run it: a
Python that has torch and nothing else of the project's needs, the offline bundle installed with no
index, its parts under their budgets, killed in the middle, and its tarball synced into a fresh
MLflow store afterwards, on a machine that has MLflow."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench import gpu_check

REPO = Path(__file__).resolve().parent.parent


def _torch_and_its_needs() -> set[str]:
    """torch's distribution and those it requires, recursively (no extras)."""
    seen, todo = set(), ["torch"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [re.split(r"[ ;<>=!~\[(]", r, maxsplit=1)[0] for r in md.distribution(name).requires or []
                 if "extra ==" not in r]
    return seen


def torch_only_python(where: Path) -> Path:
    """A venv whose only packages are torch and its own needs: this environment's copies, linked
    into one folder that a .pth file adds (a copy would be hundreds of MB and a pip install a minute)."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    linked = where / "torch-only"
    linked.mkdir()
    for name in _torch_and_its_needs():
        dist = md.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (linked / top).exists() and not top.endswith(".pth"):
                (linked / top).symlink_to(source)
    site = next(where.glob("lib/python*/site-packages"))
    (site / "torch-only.pth").write_text(f"{linked}\n")
    python = where / "bin" / "python"
    missing = subprocess.run([python, "-c", "import importlib.util as u; import torch; "
                              "print([m for m in ('hydra', 'omegaconf', 'submitit', 'numpy', 'mlflow', 'yaml') "
                              "if u.find_spec(m)])"], capture_output=True, text=True, check=True)
    assert missing.stdout.strip() == "[]", missing.stdout  # torch imports; nothing else is there
    return python


def test_a_part_past_its_budget_is_stopped_and_says_so(tmp_path):
    check = gpu_check.Check(out=tmp_path, python=sys.executable, cpu=True, deadline=time.monotonic() + 60,
                            env=dict(os.environ), work=tmp_path)
    t0 = time.monotonic()
    rc, text = gpu_check.run_logged(check, [sys.executable, "-c", "import time; print('started', flush=True); "
                                            "time.sleep(60)"], "part.log", budget_s=1.5)
    assert rc is None and time.monotonic() - t0 < 15
    assert "started" in text and "stopped at its budget of 2 s" in text


def _tuned_blocks(out: Path, part: str) -> list[float]:
    """The tuned side's block times the check's own file holds for ``part`` ([] until there are some)."""
    try:
        tuned = json.loads((out / "gpu-check.json").read_text()).get("tuned", {})
    except (OSError, json.JSONDecodeError):
        return []
    return tuned.get(part, {}).get("sides", {}).get("tuned", {}).get("block_s") or []


@pytest.mark.slow
def test_rehearsal_offline_install_kill_in_the_middle_then_sync(tmp_path):
    python = torch_only_python(tmp_path / "node")
    bundle = tmp_path / "bundle"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(["bash", "scripts/offline-bundle", str(bundle)], cwd=REPO, check=True,
                   env={**os.environ, "BUNDLE_PYTHON_VERSION": version, "PYTHON": sys.executable})
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(python), "GPU_CHECK_BUNDLE": str(bundle), "GPU_CHECK_OUT": str(out)}
    env.pop("PYTHONPATH", None)
    # The install's budget is the GPU node's (10 s there); a loaded 2-core machine can take 20.
    check = subprocess.Popen(["bash", "scripts/gpu-check", "--cpu", "--only", "environment,install,cells,resnet50-fp16",
                              "--budget", "install=60"],
                             cwd=REPO, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    assert check.stderr is not None
    for line in check.stderr:  # one line per part as it ends
        lines.append(line)
        if line.startswith("gpu-check: cells:"):
            # Cut off inside the resnet50-fp16 part, once its tuned side has been timed: the check's
            # files must already hold that figure (a device call killed at its limit keeps only them).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not _tuned_blocks(out, "resnet50-fp16"):
                time.sleep(0.5)
            os.killpg(check.pid, signal.SIGKILL)
            break
    check.wait(timeout=30)
    assert any(line.startswith("gpu-check: install: pass") for line in lines), lines
    assert any(line.startswith("gpu-check: cells: pass") for line in lines), lines

    # What a killed check leaves: the table of the parts it finished, and their sweeps.
    results = (out / "BENCH_RESULTS_GPU.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in results.splitlines() if line.startswith("| ")}
    assert {"environment", "install", "cells", "resnet50-fp16"} <= set(rows), results
    assert "no index" in rows["install"] and "running: the call ended inside this part" in rows["resnet50-fp16"]
    assert _tuned_blocks(out, "resnet50-fp16"), "the cut part's figures are not in the check's files"
    assert len([p for p in out.iterdir() if not p.name.startswith(".")]) <= 8
    extracted = tmp_path / "elsewhere"
    with tarfile.open(out / "sweeps.tar.gz") as tar:
        tar.extractall(extracted, filter="data")
    sweeps = sorted(extracted.iterdir())
    assert len(sweeps) == 2  # one launch per cell (the strategies' tuning settings differ)
    sweep = sweeps[0]
    measured = {json.loads((c / "spec.json").read_text())["cell"]: json.loads((c / "result.json").read_text())
                for c in (sweep / "cells").iterdir()}
    assert len(measured) == 1

    # Afterwards, where MLflow is: the sweep into a fresh store, read back through MLflow's client.
    (tmp_path / "store").mkdir()
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    subprocess.run([sys.executable, "-m", "launcher.sync", str(sweep), "--tracking-uri", uri], cwd=tmp_path,
                   check=True, capture_output=True)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    cells = {r.data.tags["cell"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    for name, result in measured.items():
        assert cells[name].data.metrics["throughput_samples_per_s"] == pytest.approx(
            result["summary"]["throughput_samples_per_s"])


# ---- the second edition's pieces, on CPU: the tuned loop, the worker beside it, the targets, the tree

def test_the_tuned_loss_is_cross_entropy_without_an_fp32_copy_of_the_logits():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from bench.tuned import LowPrecisionCrossEntropy

    torch.manual_seed(0)
    for dtype, digits in ((torch.bfloat16, 3e-3), (torch.float16, 5e-4)):
        logits = (3 * torch.randn(10, 37)).to(dtype).requires_grad_()
        targets = torch.randint(0, 37, (10,))
        loss = LowPrecisionCrossEntropy.apply(logits, targets, 3)  # 4 chunks of rows, the last one short
        (1024 * loss).backward()  # a loss scale, as fp16's GradScaler applies it
        reference_logits = logits.detach().float().requires_grad_()
        reference = F.cross_entropy(reference_logits, targets)
        (1024 * reference).backward()
        assert logits.grad.dtype == dtype
        assert float(loss.detach()) == pytest.approx(float(reference.detach()), rel=1e-6)
        assert torch.allclose(logits.grad.float(), reference_logits.grad, atol=digits * 103, rtol=digits)


def test_the_tuned_loop_trains_a_cnn_channels_last_with_fused_adamw():
    torch = pytest.importorskip("torch")
    from bench.tuned import TunedLoop
    from contract.spec import InputKind, ModelSpec

    loop = TunedLoop(ModelSpec(name="cnn", input=InputKind.image, image_size=16), "bf16", 2, torch.device("cpu"),
                     compile=False)
    first = [p.detach().clone() for p in loop.model.parameters()]
    losses = [float(loop.step()) for _ in range(3)]
    assert all(x == x and x > 0 for x in losses)
    conv = next(p for p in loop.model.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    assert loop.pool[0][0].is_contiguous(memory_format=torch.channels_last)
    assert loop.optimizer.defaults["fused"] is True
    assert any(not torch.equal(a, b) for a, b in zip(first, loop.model.parameters(), strict=True))


def _one_rank_env() -> dict[str, str]:
    from tests.ranks import free_ports

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    return {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0]), "OMP_NUM_THREADS": "1"}


def test_the_tuned_job_keeps_inside_its_budget_and_says_what_it_skipped(tmp_path):
    out = tmp_path / "tuned.json"
    subprocess.run([sys.executable, str(REPO / "bench" / "tuned.py"), "--model", "gpt_tiny", "--seq-len", "16",
                    "--vocab-size", "64", "--batch-size", "2", "--sides", "tuned,ddp", "--rounds", "4",
                    "--block-steps", "1", "--warmup-steps", "1", "--budget-s", "1", "--out", str(out)],
                   cwd=REPO, env=_one_rank_env(), check=True, timeout=120, capture_output=True)
    (config,) = json.loads(out.read_text())["configs"]
    assert "would leave none for its rounds" in config["sides"]["ddp"]["skipped"]
    # Timed as soon as it was built: one round, then the budget.
    assert len(config["sides"]["tuned"]["block_s"]) == 1
    assert config["rounds_cut"] == {"tuned": "after 1 rounds: the job's budget"}


def test_the_tuned_job_runs_beside_the_worker_and_the_check_reads_it(tmp_path):
    """bench/tuned.py at tiny shapes on CPU, as the check's gpt2 part runs it: every side's blocks,
    the worker's settings (only those this spec has), the anatomy and the fabric timing at one rank;
    then the check's figures and targets from it."""
    from bench import tuning

    out = tmp_path / "tuned.json"
    env = _one_rank_env()
    subprocess.run([sys.executable, str(REPO / "bench" / "tuned.py"), "--model", "gpt_tiny", "--seq-len", "32",
                    "--vocab-size", "200", "--batch-size", "2", "--rounds", "2", "--block-steps", "2",
                    "--warmup-steps", "1", "--warmup-blocks", "1", "--anatomy-steps", "1", "--fabric",
                    "--profile-blocks", "--precisions", "bf16", "--worker-set", 'strategy.sharding="grad_op"',
                    "--out", str(out)],
                   cwd=REPO, env=env, check=True, timeout=120, capture_output=True)
    result = json.loads(out.read_text())
    (config,) = result["configs"]
    assert config["sides"]["tuned"]["vocab_size"] == 256  # 200 padded to a multiple of 64
    # Each side timed as soon as it was built, in rounds with every side built before it.
    for side, blocks in (("tuned", 6), ("ddp", 4), ("fsdp", 2)):
        assert len(config["sides"][side]["block_s"]) == blocks, config["sides"][side]
    assert [r["phase"] for r in config["rounds"]] == ["tuned", "tuned", "ddp", "ddp", "fsdp", "fsdp"]
    # A setting the worker refuses (its ConfigError) is said and left out; the side still runs.
    (refused,) = config["sides"]["ddp"]["settings_refused"]
    assert refused.startswith("strategy.sharding='grad_op': strategy.sharding='grad_op': sharding applies to FSDP only")
    assert config["sides"]["fsdp"]["settings_set"]["strategy.sharding"] == "grad_op"
    for strategy in ("ddp", "fsdp"):
        side = config["sides"][strategy]
        wanted = {**tuning.worker_tuning("gpt_tiny", strategy, cuda=False), "strategy.sharding": "grad_op"}
        assert set(side["settings_set"]) | set(side["settings_not_in_spec"]) == set(wanted) - {"strategy.sharding"} \
            if strategy == "ddp" else set(wanted)
        assert all(tuning.spec_knows(k) for k in side["settings_set"])
        assert side["anatomy"]["anatomy_step_time_ms"] > 0
        # A worker block is its schedule's measured window: inside the whole schedule's wall time.
        assert len(side["schedule_s"]) == len(side["block_s"])
        assert all(0 < w < s for w, s in zip(side["block_s"], side["schedule_s"], strict=True))
    for side in config["sides"].values():  # one profiled block each; on CPU no device figures
        profile = side["profile"]
        assert profile["steps"] == 2 and 0 < profile["host_queue_ms"] <= profile["wall_ms"], profile
        assert profile["top_host_ms"] and "device_busy_ms" not in profile
    assert {p["collective"] for p in result["fabric"]["points"]} == {"all_reduce", "all_gather", "reduce_scatter"}

    check = gpu_check.Check(out=tmp_path, python=sys.executable, cpu=True, deadline=time.monotonic() + 60,
                            env=dict(os.environ), work=tmp_path, device="cpu")
    check.tuned["gpt2"] = {**config, "model": result["model"], "device": result["device"], "fabric": result["fabric"]}
    figures = gpu_check.tuned_figures(check.tuned["gpt2"])
    blocks = config["sides"]
    expected = statistics.median(r["ddp"] / r["fsdp"] for r in config["rounds"] if "fsdp" in r)
    assert figures["fsdp"]["vs_ddp"] == pytest.approx(expected)
    assert figures["tuned"]["throughput"] == pytest.approx(
        2 * config["block_steps"] * 32 / statistics.median(blocks["tuned"]["block_s"]))
    rows = {t: (m, v) for t, m, v in gpu_check.targets(check)}
    assert rows["gpt_tiny bf16: FSDP / DDP at one rank >= 0.95"][1] == "not judged (CPU rehearsal)"
    text = gpu_check.render(check, "now", "commit x")
    assert "## Targets" in text and "MFU's denominator" in text and "**The tree that ran**: commit x" in text
    details = "\n".join(gpu_check.tuned_details(check, check.tuned["gpt2"], figures))
    assert "**One block of each side under the profiler**" in details and "| fsdp |" in details


def test_targets_are_judged_on_a_gpu_from_the_block_times():
    # The arithmetic of the verdicts, on block times given here (not measured): a GPU check judges
    # each target from the figures, never from a number written in the code.
    config = {"precision": "bf16", "model": "gpt2-small", "device": "NVIDIA H100 80GB HBM3", "unit": "tokens",
              "samples_per_block_step": 32, "unit_per_sample": 1024, "block_steps": 10, "flops_per_sample": None,
              "sides": {"tuned": {"block_s": [0.80, 0.80]}, "ddp": {"block_s": [0.81, 0.82]},
                        "fsdp": {"block_s": [0.90, 0.90]}}}
    check = gpu_check.Check(out=Path("."), python=sys.executable, cpu=False, deadline=0.0, env={}, work=Path("."))
    check.tuned["gpt2"] = config
    rows = {t: (m, v) for t, m, v in gpu_check.targets(check)}
    assert rows["gpt2-small bf16, the worker, tokens/s >= 377,000"][1] == "PASS"  # 327,680 / 0.815 s
    assert rows["gpt2-small bf16: FSDP / DDP at one rank >= 0.95"][1] == "FAIL"  # 0.906
    assert rows["gpt2-small bf16: the worker's DDP / the tuned loop >= 0.97"][1] == "PASS"  # 0.982
    assert rows["resnet50 bf16, the worker, img/s >= 3,000"] == ("-", "not measured")


def test_worker_settings_are_set_only_where_the_spec_has_them():
    from bench import tuning

    assert tuning.spec_knows("train.compile") and tuning.spec_knows("precision.mode")
    assert not tuning.spec_knows("train.no_such_setting") and not tuning.spec_knows("train.compile.x")
    known, unknown = tuning.split_known({"train.compile": True, "strategy.no_such_knob": 1})
    assert known == {"train.compile": True} and unknown == ["strategy.no_such_knob"]
    assert tuning.launcher_override("train.compile", True) == "compile=true"
    assert tuning.launcher_override("model.vocab_multiple", 64) == "model.vocab_multiple=64"
    assert tuning.launcher_override("strategy.reshard_after_forward", None) == "strategy.reshard_after_forward=null"
    # The launcher's refusal of a tuning setting names it: the cells part reruns the cell without it.
    refused = subprocess.run([sys.executable, "-m", "launcher", "-m", "strategy=ddp", "strategy.sharding=grad_op",
                              "tracking=off", "runs=1", "output_root=/proc/nowhere"], cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0
    key, sentence = gpu_check.refusal((refused.stdout + refused.stderr).splitlines(), {"strategy.sharding": "grad_op"})
    assert key == "strategy.sharding" and sentence.startswith("strategy.sharding='grad_op': sharding applies to FSDP")
    settings, known, unknown = gpu_check.cell_settings(
        gpu_check.Check(out=Path("."), python="", cpu=False, deadline=0.0, env={}, work=Path(".")), "resnet50", "fsdp")
    assert "compile=true" in settings and set(known) | set(unknown) == set(tuning.worker_tuning("resnet50", "fsdp", cuda=True))


def test_the_tree_is_named_from_git_or_from_its_record(tmp_path, monkeypatch):
    record = gpu_check.record_tree()  # this checkout, with git
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head and "bench/gpu_check.py" in record["files"]
    assert gpu_check.tree_identity().startswith(f"commit {head[:12]} (")
    # A node that got the tree without .git: the record says what it was, the files say whether it still is.
    (tmp_path / "a.py").write_text("x = 1\n")
    files = {"a.py": gpu_check._file_digest(tmp_path / "a.py")}
    (tmp_path / gpu_check.TREE_RECORD).write_text(json.dumps(
        {"commit": "f" * 40, "dirty": True, "recorded": "then", "files": files,
         "content_sha256": gpu_check.content_digest(files)}))
    monkeypatch.setattr(gpu_check, "REPO", tmp_path)
    # Matching the record, the record names it, whether or not a .git came along (a copied .git may be older).
    assert gpu_check.tree_identity().endswith(f"the recorded content exactly; identity from {gpu_check.TREE_RECORD}")
    assert "ffffffffffff (dirty when recorded then)" in gpu_check.tree_identity()
    (tmp_path / "a.py").write_text("x = 2\n")
    assert "DIFFERS from the record in 1 file(s): a.py" in gpu_check.tree_identity()

"""The GPU review's checklist (see scripts/gpu-check), on CUDA ranks: every test here is marked
``gpu`` and skips without CUDA. Ranks run through tests/ranks.py's ``run_ranks`` (no launcher,
submitit or MLflow) with ``gpus_per_node`` set, so the worker takes its CUDA path: NCCL (with gloo
for CPU tensors), one GPU per rank, models built on meta and sharded before materialising.
"""

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from jobs import comm, peaks  # noqa: E402
from jobs.data import POOL_STEPS  # noqa: E402
from tests.ranks import make_spec, run_ranks  # noqa: E402

N_GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(N_GPUS == 0, reason="needs a CUDA GPU")]
two_gpus = pytest.mark.skipif(N_GPUS < 2, reason="needs 2 GPUs")

GPT2_SMALL = dict(name="gpt2-small", input="tokens", seq_len=512, vocab_size=50257)
RESNET18 = dict(name="resnet18", input="image", image_size=64, num_classes=1000)
STEPS = POOL_STEPS + 1  # the last step revisits the first batch: the loss must fall
LR = 3e-4


def ok(results):
    errors = [r["error"] for r in results if "error" in r]
    assert not errors, errors[0]
    return results[0]


def gpu_spec(out: Path, *, strategy="ddp", precision="fp32", model=GPT2_SMALL, world_size=1, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("steps", STEPS)
    kw.setdefault("warmup_steps", 2)
    kw.setdefault("lr", LR)
    return make_spec(out, strategy=strategy, precision=precision, model=model, world_size=world_size,
                     gpus_per_node=world_size, **kw)


# ---- 1. environment ---------------------------------------------------------------------------

def test_environment_and_peak_flops():
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F401
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler  # noqa: F401

    name = torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {torch.cuda.nccl.version()}, {name}, "
          f"capability {torch.cuda.get_device_capability(0)}, {N_GPUS} GPU(s)")
    torch.amp.GradScaler("cuda")
    precision = "bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
    assert peaks.peak_flops_for(name, precision) is not None, f"H1: no peak for {name!r}"


# ---- 2. world-size-1 NCCL matrix --------------------------------------------------------------

# fp16 cells warm up over a whole extra pool of batches: the GradScaler backs off from 65536 by
# skipping its first overflowing steps, which must not land in a 3-step window (steps_skipped)
# or make the last loss the first one's (GPU review 3, G9). Step 8 revisits batch 0 again.
FP16 = dict(steps=2 * POOL_STEPS + 1, warmup_steps=POOL_STEPS + 2)

MATRIX = {
    **{f"{s}-{p}": dict(strategy=s, precision=p, **(FP16 if p == "fp16" else {}))
       for s in ("ddp", "fsdp") for p in ("fp32", "bf16", "fp16")},
    "fsdp-bf16-params": dict(strategy="fsdp", precision="bf16", precision_args={"mode": "params"}),
    "zero2-bf16": dict(strategy="zero2", precision="bf16"),
    "noshard-bf16": dict(strategy="fsdp_noshard", precision="bf16"),
    "offload-bf16": dict(strategy="fsdp", precision="bf16", strategy_args={"cpu_offload": True}),
    "offload-fp16": dict(strategy="fsdp", precision="fp16", strategy_args={"cpu_offload": True}, **FP16),
    "fsdp-ckpt-prefetch": dict(strategy="fsdp", precision="bf16", activation_checkpointing=True,
                               strategy_args={"prefetch": 1}),
    "ddp-accum2": dict(strategy="ddp", precision="bf16", grad_accum_steps=2, batch_size=4),
    "fsdp-accum2": dict(strategy="fsdp", precision="bf16", grad_accum_steps=2, batch_size=4),
    "fsdp-compile": dict(strategy="fsdp", precision="bf16", compile=True),
    "resnet18-ddp-bf16": dict(strategy="ddp", precision="bf16", model=RESNET18, batch_size=64),
    "resnet18-fsdp-bf16": dict(strategy="fsdp", precision="bf16", model=RESNET18, batch_size=64),
    # R1: offload with buffers (BatchNorm's running statistics must be on the GPU).
    "resnet18-offload-bf16": dict(strategy="fsdp", precision="bf16", model=RESNET18, batch_size=64,
                                  strategy_args={"cpu_offload": True}),
    **{f"resnet18-fsdp-bf16-params-{bn}": dict(strategy="fsdp", precision="bf16", model=RESNET18, batch_size=64,
                                               precision_args={"mode": "params", "batchnorm": bn})
       for bn in ("unit", "grouped")},
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_matrix")
    specs = {k: gpu_spec(root / k, **v) for k, v in MATRIX.items()}
    return dict(zip(specs, run_ranks(list(specs.values()), world_size=1, timeout_s=580), strict=True))


@pytest.mark.parametrize("run", list(MATRIX))
def test_matrix_run_trains_on_nccl(matrix, run):
    result = ok(matrix[run])
    tags, summary, losses = result["tags"], result["summary"], result["losses"]
    assert tags["backend"] == "nccl" and tags["process_group_backend"] == "cpu:gloo,cuda:nccl"
    assert tags["gpu_uuids"].count("GPU-") == 1  # NVML's form, which jobs.dist.gpu_uuid writes (R3)
    assert summary["peak_mem_allocated_gib"] > 0 and summary["peak_rss_gib"] > 0
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    if "mfu" not in summary:
        pytest.fail(f"no MFU: {tags.get('mfu_missing')}")
    assert 0 < summary["mfu"] <= 1


def test_matrix_fp32_parity_and_offload_memory(matrix):
    ddp, fsdp = ok(matrix["ddp-fp32"])["losses"], ok(matrix["fsdp-fp32"])["losses"]
    assert fsdp == pytest.approx(ddp, rel=1e-3)
    on_gpu = ok(matrix["fsdp-bf16"])["summary"]["peak_mem_allocated_gib"]
    offloaded = ok(matrix["offload-bf16"])["summary"]["peak_mem_allocated_gib"]
    assert offloaded < on_gpu


def test_user_model_starts_from_the_same_weights_under_every_strategy(tmp_path):
    # R4 on the GPU: a _target_ model built eagerly on the host, then moved (DDP) or sharded (FSDP,
    # offload); fp32, one rank, the same seed: the first losses agree.
    from tests.test_gpu_path import USER_MODEL

    variants = {"ddp": {}, "fsdp": dict(strategy="fsdp"),
                "offload": dict(strategy="fsdp", strategy_args={"cpu_offload": True})}
    specs = [gpu_spec(tmp_path / k, model=USER_MODEL, steps=2, warmup_steps=1, **v) for k, v in variants.items()]
    firsts = [ok(r)["losses"][0] for r in run_ranks(specs, world_size=1, timeout_s=300)]
    print("user model first losses (ddp, fsdp, offload):", firsts)
    assert firsts[1] == pytest.approx(firsts[0], rel=1e-5) and firsts[2] == pytest.approx(firsts[0], rel=1e-5)


def test_matrix_batchnorm_units_timing(matrix):
    # M2: one fp32 unit per BatchNorm (with casts) against all BatchNorms in one uncast unit.
    # Reported, not asserted: scripts/gpu-check copies this line into BENCH_RESULTS_GPU.md.
    times = {bn: ok(matrix[f"resnet18-fsdp-bf16-params-{bn}"])["summary"]["step_time_ms_p50"]
             for bn in ("unit", "grouped")}
    print(f"BatchNorm units: resnet18 bf16 params, p50 step ms: unit {times['unit']:.2f}, "
          f"grouped {times['grouped']:.2f}")


def test_matrix_fp16_skipped_steps_are_counted(matrix):
    for run in ("ddp-fp16", "fsdp-fp16", "offload-fp16"):
        summary = ok(matrix[run])["summary"]
        assert "fp16_skipped_steps" in summary and "fp16_skipped_steps_warmup" in summary


def test_matrix_mfu_against_the_measured_matmul_peak(matrix):
    # Same achieved FLOP/s divided by two peaks: mfu x datasheet == mfu_measured_peak x measured.
    for run in MATRIX:
        result = ok(matrix[run])
        summary, tags = result["summary"], result["tags"]
        assert summary.get("measured_matmul_tflops", 0) > 0, (run, tags.get("mfu_measured_missing"))
        assert "mfu_formula" in tags and "mfu_measured_formula" in tags, run
        if "mfu" in summary and "mfu_measured_peak" in summary:
            assert summary["mfu"] * summary["peak_flops_per_s"] == pytest.approx(
                summary["mfu_measured_peak"] * summary["measured_matmul_tflops"] * 1e12, rel=1e-9)


# ---- GPU figures: measured matmul peak, energy, the job's own system metrics ---------------------

def test_measured_matmul_peak_is_a_plausible_share_of_the_datasheet():
    from jobs import matmul_peak

    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(0)
    low = "bf16" if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
    for precision in (low, "fp32"):
        # cuBLAS's workspace (32 MiB on Hopper) comes from torch's allocator at a stream's first
        # matmul and stays for the process: the model's first matmul would make it anyway. Made
        # here first, so that what is compared is measure()'s own buffers (the first GPU check
        # found those 32 MiB, docs/gpu/run1).
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        warm = torch.ones(64, 64, device=device, dtype=dtype)
        (warm @ warm).sum().item()
        del warm
        before = torch.cuda.memory_allocated(device)
        measured = matmul_peak.measure(device, precision)
        assert "missing" not in measured, measured
        assert torch.cuda.memory_allocated(device) == before  # its buffers are gone before the window
        math_mode = "tf32" if measured["tf32"] else "fp32"
        datasheet = peaks.peak_flops_for(name, precision, math_mode)
        print(f"measured matmul peak {name} {precision} n={measured['n']}: {measured['measured_matmul_tflops']:.1f} "
              f"TFLOP/s, datasheet {datasheet and datasheet / 1e12} TFLOP/s")
        if datasheet:
            # A unit slip (x1000) or timing without the sync would land far outside this band.
            assert 0.1 * datasheet <= measured["measured_matmul_tflops"] * 1e12 <= 1.15 * datasheet


def test_energy_and_system_metrics_of_the_job_gpu(tmp_path):
    import json

    pynvml = pytest.importorskip("pynvml", reason="pip install nvidia-ml-py: energy and system metrics use NVML")
    # Uncompiled: the energy path is the question here, and a cold compile of GPT-2 would not fit the
    # check's part for this test.
    result = ok(run_ranks(gpu_spec(tmp_path, precision="bf16", steps=30, warmup_steps=5, compile=False), 1))
    summary, tags = result["summary"], result["tags"]
    assert "energy_missing" not in tags, tags.get("energy_missing")
    from jobs.dist import gpu_uuid

    pynvml.nvmlInit()
    # The rank's GPU: the first one visible here (tests/ranks.py gives a 1-rank job that device),
    # found by UUID, as the worker finds it; NVML's handle 0 need not be CUDA's device 0 (R7).
    handle = pynvml.nvmlDeviceGetHandleByUUID(gpu_uuid(torch.device("cuda", 0)).encode())
    nvml_index = pynvml.nvmlDeviceGetIndex(handle)
    limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3
    print(f"energy {summary['energy_j']:.1f} J, {summary['energy_j_per_sample']:.4f} J/sample, mean power "
          f"{summary['power_w_mean']:.0f} W (limit {limit_w:.0f} W), method {tags['energy_method']}")
    assert 0 < summary["power_w_mean"] <= 1.2 * limit_w
    samples = 8 * summary["measured_steps"]
    assert summary["energy_j_per_sample"] == pytest.approx(summary["energy_j"] / samples)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    system = [r for r in records if r["kind"] == "system"]
    prefix = f"system/node0/gpu{nvml_index}_"
    assert system and tags["system_metrics_devices"].startswith(f"node0/gpu{nvml_index}=")
    keys = set().union(*system) - {"kind", "step", "time"}
    assert {prefix + "utilization_percent", prefix + "power_w"} <= keys, keys
    assert all(k.startswith(prefix) for k in keys)  # this job's one GPU, no other
    assert max(r.get(prefix + "utilization_percent", 0) for r in system) > 0


# ---- 3. profiler: what the GPU timeline holds (H2) ----------------------------------------------

def test_profiler_annotations_and_compute_on_gpu(tmp_path):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from contract.spec import ModelSpec, Precision, PrecisionMode, PrecisionSpec, Strategy, StrategySpec
    from jobs import models, parallel

    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        torch.cuda.set_device(0)
        with torch.device("meta"):
            model = models.build_model(ModelSpec(name="gpt_tiny", seq_len=128, vocab_size=1024))
        par = parallel.parallelize(model, StrategySpec(name=Strategy.fsdp),
                                   PrecisionSpec(name=Precision.bf16, mode=PrecisionMode.params),
                                   device=torch.device("cuda", 0))
        x = torch.randint(0, 1024, (8, 128), device="cuda")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                par.model(x).float().sum().backward()
            torch.cuda.synchronize()
        events = prof.events()
        gpu = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
        annotations = sorted({e.name for e in gpu if getattr(e, "is_user_annotation", False)})
        print("GPU user annotations:", annotations)
        kinds = comm.classify_events(events, main_thread=-1, on_gpu=True)
        assert kinds["compute"], "no compute intervals on the GPU timeline"
        # A world of one still launches NCCL kernels for FSDP's collectives (or none at all):
        # whichever, no annotation may be counted as either.
        names = {e.name for e in gpu if not getattr(e, "is_user_annotation", False)}
        assert not any(n.startswith("FSDP::") for n in names)
    finally:
        dist.destroy_process_group()


# ---- 4. checkpoint and resume on GPU ----------------------------------------------------------

@pytest.mark.parametrize("variant", [dict(strategy="ddp"), dict(strategy="fsdp"),
                                     dict(strategy="fsdp", strategy_args={"cpu_offload": True})])
def test_resume_matches_the_uninterrupted_run(tmp_path, variant):
    spec = gpu_spec(tmp_path / "run", precision="bf16", model=dict(GPT2_SMALL, seq_len=128), steps=6,
                    warmup_steps=1, **variant)
    spec.checkpoint.every_steps = 3
    first = ok(run_ranks(spec, world_size=1, timeout_s=300))
    again = ok(run_ranks(spec, world_size=1, timeout_s=300))
    assert again["tags"]["resumed_from_step"] == "3"
    assert again["losses"][3:] == pytest.approx(first["losses"][3:], rel=1e-3)


# ---- 5. data paths ----------------------------------------------------------------------------

def test_token_file_and_npy_image_folder(tmp_path):
    import numpy as np

    tokens = tmp_path / "train.bin"
    np.random.default_rng(0).integers(0, 50257, 200_000, dtype=np.uint16).tofile(tokens)
    images = tmp_path / "images"
    for c in ("a", "b"):
        (images / c).mkdir(parents=True)
        for i in range(32):
            np.save(images / c / f"{i}.npy", np.random.default_rng(i).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    specs = [
        gpu_spec(tmp_path / "tok", model=dict(GPT2_SMALL, seq_len=128), steps=4, warmup_steps=1,
                 data={"kind": "token_file", "path": str(tokens), "num_workers": 2, "pin_memory": True}),
        gpu_spec(tmp_path / "img", model=dict(RESNET18, num_classes=2), steps=4, warmup_steps=1, batch_size=16,
                 data={"kind": "image_folder", "path": str(images), "num_workers": 2}),
    ]
    for results in run_ranks(specs, world_size=1, timeout_s=300):
        assert all(math.isfinite(x) for x in ok(results)["losses"])


# ---- 6. two ranks ---------------------------------------------------------------------------------

@pytest.mark.skipif(N_GPUS != 1, reason="the one-GPU host's duplicate check")
def test_two_ranks_on_one_gpu_fail_fast_naming_the_duplicate(tmp_path):
    results = run_ranks(gpu_spec(tmp_path / "dup", world_size=2, model=dict(GPT2_SMALL, seq_len=64), steps=2,
                                 warmup_steps=1), world_size=2, timeout_s=120)
    for r in results:
        assert "error" in r
        assert "share GPU" in r["error"] or "Duplicate GPU" in r["error"], r["error"][-2000:]


@two_gpus
def test_two_gpus_parity_fp16_syncbn_and_offload_fp16(tmp_path):
    small = dict(GPT2_SMALL, seq_len=128)
    specs = {
        "ddp-fp32": gpu_spec(tmp_path / "ddp-fp32", world_size=2, model=small),
        "fsdp-fp32": gpu_spec(tmp_path / "fsdp-fp32", strategy="fsdp", world_size=2, model=small),
        "ddp-fp16": gpu_spec(tmp_path / "ddp-fp16", precision="fp16", world_size=2, model=small),
        "syncbn": gpu_spec(tmp_path / "syncbn", world_size=2, model=RESNET18, batch_size=32, sync_batchnorm=True),
        # H4: found-inf flags of CPU-offloaded gradients all-reduced on the gloo half of the group.
        "offload-fp16": gpu_spec(tmp_path / "offload-fp16", strategy="fsdp", precision="fp16", world_size=2,
                                 model=small, strategy_args={"cpu_offload": True}),
    }
    results = dict(zip(specs, run_ranks(list(specs.values()), world_size=2, timeout_s=580), strict=True))
    assert ok(results["fsdp-fp32"])["losses"] == pytest.approx(ok(results["ddp-fp32"])["losses"], rel=1e-3)
    for name in ("ddp-fp16", "syncbn", "offload-fp16"):
        result = ok(results[name])
        assert all(math.isfinite(x) for x in result["losses"]), name
        assert len(set(result["tags"]["gpu_uuids"].split(","))) == 2
        assert result["summary"]["comm_time_ms"] > 0  # NCCL kernels found on the GPU timeline

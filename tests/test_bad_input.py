"""The bad-input corpus: every kind of mistake gets one paragraph naming the setting, the value and
the fix; no traceback; nothing is created or submitted."""

import pytest

from launcher.__main__ import main

# (overrides, text that must appear: the setting and/or value, text of the fix)
CORPUS = [
    # types
    (["nodes=abc"], "nodes", "right type"),
    (["batch_size=1.5"], "batch_size", "right type"),
    (["seed=xyz"], "seed", "right type"),
    (["wait=maybe"], "wait", "right type"),
    (["activation_checkpointing=sometimes"], "activation_checkpointing", "right type"),
    # ranges
    (["nodes=0"], "nodes=0", "nodes=1 or more"),
    (["batch_size=-4"], "batch_size=-4", "per-device batch"),
    (["steps=0"], "steps=0", "steps="),
    (["warmup_steps=-1"], "warmup_steps=-1", "warmup_steps=0 or more"),
    (["warmup_steps=30", "steps=30"], "warmup_steps=30", "raise steps"),
    (["repeats=0"], "repeats=0", "repeats=1 or more"),
    (["repeats=50"], "repeats=50", "raise steps"),
    (["grad_accum_steps=0"], "grad_accum_steps=0", "grad_accum_steps=1"),
    (["lr=0"], "lr=0", "positive learning rate"),
    (["strategy.bucket_cap_mb=-1"], "strategy.bucket_cap_mb=-1.0", "MiB"),
    (["strategy=fsdp", "strategy.prefetch=-2"], "strategy.prefetch=-2", "use 0"),
    (["model.seq_len=0"], "model.seq_len=0", "positive integer"),
    (["cluster.tasks_per_node=0"], "cluster.tasks_per_node=0", "one task per rank"),
    (["cluster.cpus_per_task=0"], "cluster.cpus_per_task=0", "1 or more"),
    (["cluster.timeout_min=0"], "cluster.timeout_min=0", "time limit in whole minutes"),
    (["cluster.signal_delay_s=-5"], "cluster.signal_delay_s=-5", "seconds of warning"),
    (["cluster.mem_gb=-1"], "cluster.mem_gb=-1.0", "memory per node"),
    # Slurm settings on the local cluster would be dropped: refused
    (["cluster.partition=gpu"], "cluster.partition is read only by cluster=slurm (a setting of the slurm backend)",
     "use cluster=slurm"),
    (["cluster=torchrun", "cluster.exclude=n1"], "cluster.exclude is read only by cluster=slurm", "drop it"),
    (["cluster.gpu_type=h100"], "cluster.gpu_type='h100'", "use cluster=slurm"),
    (["cluster.account=x"], "cluster.account is read only by cluster=slurm", "use cluster=slurm"),
    (["cluster=torchrun", "cluster.srun_args=[--x]"], "read only by cluster=slurm", "drop it"),
    (["cluster.name=slurm"], "cluster.name='slurm'", "use cluster=slurm instead of cluster.name=slurm"),
    (["cluster.srun_args=['--mpi=pmix']"], "cluster.srun_args", "use cluster=slurm"),
    (["cluster.container.runtime=apptainer", "cluster.container.image=x.sif"], "cluster.container",
     "use cluster=slurm"),
    (["collective_timeout_s=0"], "collective_timeout_s=0", "collective_timeout_s=300"),
    # unknown names
    (["strategy=nope"], "strategy/nope", "pick one of ddp"),
    (["precision=fp8"], "precision/fp8", "pick one of bf16"),
    (["model=nosuch"], "model/nosuch", "pick one of bert-base"),
    (["cluster=kubernetes"], "cluster/kubernetes", "pick one of local"),
    (["model.name=gpt5"], "model.name='gpt5'", "use one of"),
    (["optimizer=lion"], "optimizer", "right type"),
    (["strategy.sharding=zero5"], "strategy.sharding", "right type"),
    (["batchsize=8"], "batchsize", "did you mean batch_size?"),
    (["+nodez=2"], "nodez", "did you mean nodes?"),
    (["+strategy.bucket_capmb=10"], "strategy.bucket_capmb", "did you mean strategy.bucket_cap_mb?"),
    (["cluster.partiton=gpu"], "cluster.partiton", "did you mean cluster.partition?"),
    # numbers that are not numbers
    (["lr=nan"], "lr=nan", "finite number"),
    (["strategy.bucket_cap_mb=inf"], "strategy.bucket_cap_mb", "finite number"),
    (["model=custom"], "model.target", "importable"),
    (["model=custom", "model.target=no.such.module.Model"], "the module 'no' is not installed here",
     "install that package"),
    # a module that is not installed: named, with the package that provides it
    (["model=custom", "model._target_=nosuch_models_pkg.nets.ResNet"],
     "the module 'nosuch_models_pkg' is not installed here (pip install nosuch_models_pkg)", "install that package"),
    # transformers configs: keys the config class does not define, sizes that cannot make a model
    (["model=hf", "+model.config.n_layerz=3"], "model.config.n_layerz=3", "did you mean model.config.n_layer?"),
    (["model=hf", "model.arch=llama", "+model.config.rms_norm_epz=1e-5"], "LlamaConfig",
     "did you mean model.config.rms_norm_eps?"),
    (["model=hf", "model.config.num_hidden_layers=-1"], "model.config.num_hidden_layers=-1", "positive integer"),
    (["model=hf", "model.config.hidden_size=0"], "model.config.hidden_size=0", "positive integer"),
    (["model=hf", "model.arch=llama", "model.config.num_attention_heads=3", "model.config.num_key_value_heads=3"],
     "model.config.num_attention_heads=3", "num_attention_heads to 2 or 4"),
    # impossible combinations
    (["strategy=hsdp", "nodes=1", "cluster.tasks_per_node=2"], "strategy.dp_replicate=-1", "nodes=2"),
    (["strategy=fsdp", "strategy.dp_shard=3", "cluster.tasks_per_node=4"], "strategy.dp_shard=3", "divides 4"),
    (["strategy=fsdp", "strategy.tp=2"], "strategy.tp=2", "strategy.tp=1"),
    (["strategy=fsdp_offload"], "strategy.cpu_offload=True", "strategy=fsdp"),
    (["precision=fp16"], "precision='fp16'", "bf16"),
    (["strategy.sharding=hybrid"], "strategy.sharding", "FSDP strategy"),
    (["strategy.cpu_offload=true"], "strategy.cpu_offload=True", "fsdp_offload"),
    (["precision.param_dtype=bf16"], "precision.param_dtype='bf16'", "precision=bf16"),
    (["precision=bf16", "precision.mode=params"], "precision.mode='params'", "precision.mode=autocast"),
    (["precision.batchnorm=grouped"], "precision.batchnorm='grouped'", "precision.mode=params"),
    (["cluster=slurm", "cluster.gpus_per_node=8", "cluster.tasks_per_node=1"], "cluster.tasks_per_node=1",
     "cluster.tasks_per_node=8"),
    (["cluster.gpus_per_node=2", "cluster.tasks_per_node=2"], "needs 2 GPU(s) on this machine; nvidia-smi finds 0",
     "cluster=slurm"),
    # models that would fail only on the ranks
    (["model=custom", "model.target=os.path.join"], "os.path.join", "nn.Module"),
    (["model=custom", "model._target_=os.path.join"], "os.path.join", "nn.Module"),
    (["cluster=slurm", "cluster.container.runtime=pyxis"], "cluster.container.image", "worker image"),
    (["model=hf", "+model.config.model_type=llama"], "model.config.model_type", "set model.arch=llama"),
    (["cluster=slurm", "cluster.container.runtime=oci", "cluster.container.image=/nonexistent/bundle"],
     "is not an OCI bundle", "scripts/oci-bundle"),
    (["-m", "cluster=local,slurm"], "cluster differs", "separate commands"),
    (["-m", "nodes=1,1"], "run twice", "remove the repeated value"),
    (["strategy=ddp,fsdp"], "strategy", "add -m"),
    # values that would reach a shell or the sbatch script
    (["cluster=slurm", "cluster.partition='gpu;rm -rf /'"], "cluster.partition", "plain Slurm partition"),
    (["cluster=slurm", "cluster.account='$(whoami)'"], "cluster.account", "plain Slurm account"),
    (["cluster=slurm", "+cluster.additional_parameters.reservation='x y'"], "additional_parameters.reservation",
     "write the value plainly"),
    (["cluster=slurm", "+cluster.additional_parameters.Bad-Key=1"], "additional_parameters.Bad-Key",
     "long option name"),
    (["cluster=slurm", "cluster.srun_args=['--x=1;reboot']"], "cluster.srun_args", "--name=value"),
    (["cluster=slurm", "cluster.setup=['module load cuda\nrm -rf /']"], "cluster.setup", "one list entry per command"),
    # the tracking store
    (["tracking.uri=http://127.0.0.1:9"], "tracking.uri='http://127.0.0.1:9'", "tracking=off"),
    (["tracking.uri=sqlite:////no/such/dir/mlflow.db"], "does not exist", "fix the URI"),
    (["tracking.experiment=' '"], "tracking.experiment", "name the MLflow experiment"),
    (["tracking.uri=ftp://nowhere/x"], "MLflow cannot log to a ftp:// store", "sqlite:////abs/path/mlflow.db"),
    (["tracking.uri=databricks"], "Databricks stores are not supported", "tracking=off"),
    (["tracking.uri=postgresql://bench@127.0.0.1:9/mlflow"], "tracking.uri='postgresql://bench@127.0.0.1:9/mlflow'",
     "tracking=off"),
    # paths that cannot be written
    (["sweep_dir=/proc/forbidden/sweep"], "sweep_dir='/proc/forbidden/sweep'", "directory you can write"),
    # syntax: Hydra's grammar meets Slurm's (a node list), commas in one value, quotes
    (["cluster.exclude=node[2-4]"], "cluster.exclude=node[2-4]", """'cluster.exclude="node[2-4]"'"""),
    (["cluster.exclude=node1,node2"], "several values need a multirun", """'cluster.exclude="node1,node2"'"""),
    (["cluster.account=it's"], "cluster.account=it's", """'cluster.account="it'"'"'s"'"""),
    (["nodes"], "key=value", "key=value"),
    (["--frobnicate"], "--frobnicate", "--help"),
]


@pytest.mark.parametrize("overrides, setting, fix", CORPUS, ids=[" ".join(c[0]) for c in CORPUS])
def test_bad_input(overrides, setting, fix, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([*overrides, f"output_root={out}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert setting in err and fix in err, err
    assert "nothing was submitted" in err and "Traceback" not in err
    assert not out.exists()  # nothing created, nothing submitted


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 30


def test_password_never_echoed(tmp_path, capsys):
    assert main(["tracking.uri=http://alice:hunter2@127.0.0.1:9", f"output_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "alice:***@" in err


def test_a_missing_module_is_named_and_never_suggested_as_the_fix(tmp_path, capsys):
    # docs/strategies.md's own example on a machine without torchvision: the cause is the missing module,
    # and the fix is to install its package, not to write the same value again.
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    target = "torchvision.models.resnet50"
    assert main(["model=custom", f"model._target_={target}", "model.input=image", f"output_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "the module 'torchvision' is not installed here (pip install torchvision)" in err, err
    assert target not in err.split("Fix:", 1)[1], err


def test_the_quoted_form_the_parse_error_suggests_is_accepted():
    from launcher.plan.grid import compose, expand

    points, _ = expand(['cluster.exclude="node[2-4]"', "cluster=slurm"], multirun=False)
    assert points == [['cluster.exclude="node[2-4]"', "cluster=slurm"]]
    assert compose(points, [])[0].config.cluster.exclude == "node[2-4]"

"""The reference for the Slurm submission benchmark: a minimal Hydra app swept by hydra-submitit-launcher.

It sweeps the same override keys as the launcher's 16-cell grid (strategy x precision x nodes x
seed). What each job runs does not matter for the benchmark, which times submission only, so the
task is a print; the plugin still blocks until every job has ended.
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    print(f"strategy={cfg.strategy} precision={cfg.precision} nodes={cfg.nodes} seed={cfg.seed}")


if __name__ == "__main__":
    main()

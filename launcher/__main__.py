"""``python -m launcher``: the run command (launcher/commands/run.py), through the commands' one list;
also the ``ddp-fsdp-bench`` console script."""

from launcher.commands import main_of

main = main_of("run")

if __name__ == "__main__":
    raise SystemExit(main())

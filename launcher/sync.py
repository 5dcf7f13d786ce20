"""``python -m launcher.sync``: the sync command (launcher/commands/sync.py), through the commands' one
list; what a sweep starts in the background to create its runs (launcher/track/runs.py)."""

from launcher.commands import main_of

main = main_of("sync")

if __name__ == "__main__":
    raise SystemExit(main())

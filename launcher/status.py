"""``python -m launcher.status``: the status command (launcher/commands/status.py), through the commands'
one list."""

from launcher.commands import main_of

main = main_of("status")

if __name__ == "__main__":
    raise SystemExit(main())

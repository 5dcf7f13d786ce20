"""``python -m launcher.health``: the health command (launcher/commands/health.py), through the commands'
one list."""

from launcher.commands import main_of

main = main_of("health")

if __name__ == "__main__":
    raise SystemExit(main())

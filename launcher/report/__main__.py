"""``python -m launcher.report``: the report command (launcher/commands/report.py), through the commands'
one list."""

from launcher.commands import main_of

main = main_of("report")

if __name__ == "__main__":
    raise SystemExit(main())

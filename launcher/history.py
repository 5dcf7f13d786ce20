"""``python -m launcher.history``: the history command (launcher/commands/history.py), through the
commands' one list."""

from launcher.commands import main_of

main = main_of("history")

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m launcher.forecast``: the forecast command (launcher/commands/forecast.py), through the
commands' one list."""

from launcher.commands import main_of

main = main_of("forecast")

if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m launcher.report``: see launcher/report/report.py."""

from launcher.report.report import main

raise SystemExit(main())

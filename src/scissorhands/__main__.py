"""``python -m scissorhands``: see :mod:`scissorhands.cli`."""

from scissorhands.cli import main

raise SystemExit(main())

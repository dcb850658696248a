"""``python -m scissorhands``: see :mod:`scissorhands.commands.cli`."""

from scissorhands.commands.cli import main

raise SystemExit(main())

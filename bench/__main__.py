"""``python -m bench`` (run from the repository root)."""

from bench.cli import main

raise SystemExit(main())

"""Moved to ``python -m scissorhands.commands.retrieval``; this old name runs it."""

from scissorhands.commands.retrieval.__main__ import main

if __name__ == "__main__":
    main()

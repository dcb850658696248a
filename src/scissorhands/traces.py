"""Moved to :mod:`scissorhands.commands.traces`; this old name is that same module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("scissorhands.commands.traces")

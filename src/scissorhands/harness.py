"""Moved to :mod:`scissorhands.commands.harness`; this old name is that same module."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("scissorhands.commands.harness")

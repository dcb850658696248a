# All metadata lives in pyproject.toml; this file only wires the cffi build.
from setuptools import setup

setup(cffi_modules=["src/scissorhands/_build_native.py:ffibuilder"])

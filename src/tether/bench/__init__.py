"""Benchmarks behind ``tether bench``: measured side by side in one run, never in unit tests.

:mod:`tether.bench.comm` times our collective algorithms against the backend's own
(``tether bench comm``), in the style of the OSU micro-benchmarks and nccl-tests.
"""

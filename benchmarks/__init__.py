"""memlab's benchmarks: scripts that write JSON (and HTML figures) to ``benchmarks/results/``.

Run them from the repository root as modules, for example ``python -m benchmarks.overhead --small``.
"""

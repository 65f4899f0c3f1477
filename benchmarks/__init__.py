"""dibs benchmarks: every figure is a ratio against a baseline measured in the same run.

Run them with ``benchmarks/run`` (full) or ``benchmarks/run --smoke`` (quick, what CI runs); see
``benchmarks/README.md`` for what each benchmark measures and ``benchmarks/results/RESULTS.md`` for
the last full run.
"""

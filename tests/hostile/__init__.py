"""A generated bad-input suite for structconv's public entry points (issue 21).

Hypothesis draws thousands of inputs (ranks, dtypes, sizes, masks, memory layouts, mixed backends,
devices, crafted files and command lines) for every public entry point; each runs in a worker
process under a memory and a time limit, and its outcome is classified as ``right``, ``clear``,
``raw``, ``silent``, ``crash`` or ``security`` (:mod:`.classify`).  Run it with
``python -m tests.hostile``; ``docs/robustness.rst`` explains it.
"""

"""Performance tools: `fedbench bench` (the local loop against a bare loop, a round, a table, CLIP features),
the startup timings (`make bench-startup`), and the GPU checks and projections (`make gpu-check`,
`make gpu-bench`). They run fedbench (the table runner and jobs of bench.scheduling) and measure it; nothing below
imports them (tests/core/test_layering.py).
"""

"""Run assembly: the run config (config.py) and its checks, devices and ranks, the run's data, the plan resolved
once from the config (run_plan.py), the run itself (experiment.py) and what it writes (records, heatmap).
It imports the round engine below it, never the table, reporting or CLI packages above it (tests/core/test_layering.py).
"""

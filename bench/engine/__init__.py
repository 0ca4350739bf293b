"""The round engine: rounds over sampled clients, aggregation by all-reduce, evaluation, checkpoints, collective
timeouts, run health. It reads a frozen RoundPlan / CheckpointPlan (round_plan.py), never the run config, and
imports only bench.core, datamodules and lightning_modules below it (tests/core/test_layering.py).
"""

"""Experiment tracking: W&B logging of runs and tables (wandb_logger.py), the observer the table runner
and the CLI pass to a run. It sits above the table definitions it names groups from, below the table
runner that uses it."""

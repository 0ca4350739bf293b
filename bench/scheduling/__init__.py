"""Running a table: which runs it needs (table_plan.py), the worker processes that run them
(table_jobs.py, job_preload.py) and `fedbench table` itself (table_runner.py): plan, run or reuse, then
render (bench.reporting) and log (bench.tracking)."""

"""`fedbench regression`: rerun the small fixed runs of configs/regression.yaml and compare their
final test metrics with results/reference/<name>.json within the config's absolute tolerances.

    fedbench regression                      # run every entry, compare, exit 1 on a regression
    fedbench regression --only [fedavg,fedcb]  # a subset (also --only fedavg fedcb, --only fedavg,fedcb)
    fedbench regression --update --reason "why the numbers moved"   # rewrite the references

Each entry runs in a fresh temporary output directory (nothing is reused). A reference records the
entry's result-config, the metrics, the reason for the update, the date, the git commit, the code
version and the versions of the numerical packages (torch, lightning, timm, ...); a reference whose
config differs from the entry's is stale and fails the comparison.
"""
from __future__ import annotations

import datetime
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.assembly.config import RunConfig, execution_keys, result_config
from bench.assembly.records import git_commit
from bench.core.atomic_io import write_json
from bench.core.code_version import code_version, same_code
from bench.core.errors import FedbenchError
from bench.core.paths import plain_name
from bench.tables.flags import CommandParser
from bench.tables.spec import (
    RUN_KEYS,
    canonical,
    check_overrides,
    load_spec,
    plain_copy,
    run_config,
    with_defaults,
)

DEFAULT_CONFIG = "configs/regression.yaml"
DEFAULT_REFERENCES = "results/reference"
CONFIG_KEYS = {"tolerance", "base", "runs"}
# a run's name, its own tolerances (optional, overriding the config's) and the options that determine its
# numbers (its experiment is regression_<name>)
ENTRY_KEYS = {"name", "tolerance"} | (RUN_KEYS - execution_keys(RunConfig) - {"experiment"})


@dataclass(frozen=True)
class RegressionEntry:
    """One run of the regression set: its name (its reference is <name>.json, its experiment regression_<name>)."""

    name: str
    overrides: dict[str, Any]  # the options that determine its numbers, over the config's base
    tolerance: dict[str, float]  # its own absolute tolerances, overriding the config's


@dataclass(frozen=True)
class RegressionSpec:
    """configs/regression.yaml, parsed and checked once (load_config)."""

    tolerance: dict[str, float]  # metric -> absolute tolerance (pp)
    base: dict[str, Any]
    runs: tuple[RegressionEntry, ...]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.runs]

    def entry(self, name: str) -> RegressionEntry:
        found = next((e for e in self.runs if e.name == name), None)
        if found is None:
            raise FedbenchError(f"No regression run named {name!r}; known: {', '.join(self.names)}.")
        return found

    def tolerance_of(self, name: str) -> dict[str, float]:
        """The absolute tolerances of entry ``name``: the config's, overridden by the entry's own."""
        return {**self.tolerance, **self.entry(name).tolerance}


def load_config(path: str = DEFAULT_CONFIG) -> RegressionSpec:
    """The regression config, checked: known keys, unique entry names, a tolerance (a number >= 0) per metric."""
    raw = load_spec(path, "Regression config", CONFIG_KEYS)
    tolerance, runs = raw.get("tolerance"), raw.get("runs")
    if not isinstance(tolerance, dict) or not tolerance or not isinstance(runs, list) or not runs:
        raise FedbenchError(f"{path}: needs 'tolerance' (metric: absolute pp) and 'runs'.")
    check_tolerances(tolerance, f"{path}: tolerance")
    names = [e.get("name") if isinstance(e, dict) else None for e in runs]
    if None in names or len(set(names)) != len(names):
        raise FedbenchError(f"{path}: every run needs a unique 'name'; got {names}.")
    entries = []
    for entry in runs:
        name = entry["name"]
        plain_name(name, f"{path}: a run's name", "the references folder")  # <name>.json, regression_<name>
        check_overrides(entry, f"{path}: run {name!r}", ENTRY_KEYS)
        own = entry.get("tolerance") or {}
        if set(own) - set(tolerance):
            raise FedbenchError(f"{path}: run {name!r} has a tolerance for metric(s) "
                                f"{sorted(set(own) - set(tolerance))} not under 'tolerance'.")
        check_tolerances(own, f"{path}: run {name!r}: tolerance")
        entries.append(RegressionEntry(name, plain_copy({k: v for k, v in entry.items() if k not in ("name", "tolerance")}),
                                       dict(own)))
    return RegressionSpec(dict(tolerance), plain_copy(raw.get("base") or {}), tuple(entries))


def check_tolerances(tolerance: dict, where: str) -> None:
    bad = {k: v for k, v in tolerance.items()
           if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0}
    if bad:
        raise FedbenchError(f"{where}: a tolerance is a number of percentage points >= 0, got {bad}.")


def entry_config(spec: RegressionSpec, name: str, output_dir: str) -> RunConfig:
    """The RunConfig of entry ``name``: defaults, then ``base``, then the entry's overrides."""
    entry = spec.entry(name)
    # accelerator "cpu": the references are CPU numbers; on a GPU machine "auto" would take CUDA (other
    # kernels, other random streams) and fail against them
    run = {"experiment": f"regression_{name}", "output_dir": output_dir, "accelerator": "cpu",
           "checkpoint_dir": str(Path(output_dir) / "ckpt"), "progress": False, "wandb": False}
    return run_config(spec.base, entry.overrides, run, where=f"regression run {name!r}")


def run_entry(spec: RegressionSpec, name: str) -> dict[str, Any]:
    """Run entry ``name`` in a fresh temporary directory; returns {config, metrics, history}."""
    from bench.assembly.experiment import run_experiment

    with tempfile.TemporaryDirectory(prefix=f"fedbench-regression-{name}-") as tmp:
        cfg = entry_config(spec, name, tmp)
        record = run_experiment(cfg)
    final = record.get("final") or {}
    metrics = {k: final.get(k) for k in spec.tolerance}
    curve = [h["metrics"].get("test/accuracy") for h in record["history"] if h.get("metrics")]
    return {"config": result_config(cfg.to_dict()), "metrics": metrics, "test_accuracy_per_round": curve,
            "protocol": record.get("protocol"), "versions": record.get("versions")}


def reference_path(name: str, reference_dir: str = DEFAULT_REFERENCES) -> Path:
    return Path(reference_dir) / f"{plain_name(name, 'a regression entry name', reference_dir)}.json"


def load_reference(name: str, reference_dir: str = DEFAULT_REFERENCES) -> dict[str, Any]:
    path = reference_path(name, reference_dir)
    if not path.exists():
        raise FedbenchError(f"No reference {path}; create it with `fedbench regression --update --only {name} "
                            "--reason \"...\"`.")
    return json.loads(path.read_text())


def compare(measured: dict[str, Any], reference: dict[str, Any], tolerance: dict[str, float]) -> list[str]:
    """Failures (empty when the run matches its reference): a stale config or a metric off by more
    than its absolute tolerance (a metric present on one side only also fails)."""
    if canonical(measured["config"]) != canonical(with_defaults(reference.get("config"))):
        return ["the entry's config differs from the reference's (stale reference: rerun with --update)"]
    failures = []
    for key, tol in tolerance.items():
        ours, ref = measured["metrics"].get(key), reference.get("metrics", {}).get(key)
        if ours is None or ref is None:
            if (ours is None) != (ref is None):
                failures.append(f"{key}: {ours} vs reference {ref}")
        elif abs(ours - ref) > tol:
            failures.append(f"{key}: {ours:.3f} vs reference {ref:.3f} (|diff| {abs(ours - ref):.3f} > {tol:g})")
    return failures


def write_reference(name: str, measured: dict[str, Any], spec: RegressionSpec, reason: str,
                    reference_dir: str = DEFAULT_REFERENCES) -> Path:
    path = reference_path(name, reference_dir)
    ref = {"name": name, **measured, "tolerance": spec.tolerance_of(name), "reason": reason,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "git_commit": git_commit(), "code_version": code_version(measured["config"])}
    write_json(path, ref)
    return path


def build_parser() -> CommandParser:
    parser = CommandParser(prog="fedbench regression", description=__doc__)
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--reference-dir", default=DEFAULT_REFERENCES)
    parser.add_argument("--only", type=list[str] | None, default=None, help="run these entries only, e.g. --only [fedavg,fedcb]")
    parser.add_argument("--update", dest="update_references", type=bool, default=False, help="rewrite the references with the new numbers")
    parser.add_argument("--reason", help="why the references change (required with --update)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.update_references and not (args.reason or "").strip():
        raise FedbenchError("--update needs --reason \"why the numbers moved\".")
    spec = load_config(args.config)
    names = args.only or spec.names
    for name in names:
        entry_config(spec, name, "unused")  # unknown names fail before anything runs
    failed = 0
    for name in names:
        measured = run_entry(spec, name)
        shown = ", ".join(f"{k}={v:.2f}" if v is not None else f"{k}=none" for k, v in measured["metrics"].items())
        if args.update_references:
            print(f"{name}: {shown} -> {write_reference(name, measured, spec, args.reason, args.reference_dir)}")
            continue
        reference = load_reference(name, args.reference_dir)
        failures = compare(measured, reference, spec.tolerance_of(name))
        if failures and not same_code(reference.get("code_version"), measured["config"]):
            failures.append(f"(the code changed since the reference: {reference.get('code_version')} -> "
                            f"{code_version(measured['config'])}; reference reason: {reference.get('reason')!r})")
        if failures and reference.get("versions") != measured["versions"]:
            failures.append(f"(package versions differ from the reference's: {reference.get('versions')} -> "
                            f"{measured['versions']}; install the locked set with `make install`)")
        failed += bool(failures)
        print(f"{name}: {'FAIL' if failures else 'ok'} ({shown})" + "".join(f"\n  {f}" for f in failures))
    if not args.update_references:
        print(f"regression: {len(names) - failed}/{len(names)} entries match their references")
    return 1 if failed else 0

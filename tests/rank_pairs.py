"""The 1-vs-2-rank checks of many configurations share one 2-rank launch (issue 41, item 3).

Each check names a case registered here (overrides of the tiny digits config of tests/conftest.py, built
from a shared folder where the case's data lives). The session fixture ``two_rank_runs`` (tests/conftest.py)
runs every case's 2-rank side once per `make test` (once for both pytest-xdist workers, under a file lock):
one Fabric launch, every case run in it one after the other, as `fedbench table` does with its rows. A
Fabric's precision plugin is fixed when it is made, so the launched ranks make one Fabric per precision on
the process group of the first (the ranks exist by then: the later Fabrics start none). Each test then runs
its case's 1-rank side in its own process (no launch: in process, as before) and compares. A case changes no option of its check: the
configurations are those the tests used to launch one 2-rank subprocess each for.

Run as a script (``python tests/rank_pairs.py cases.json``), it is the launched program itself.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES: dict[str, Callable[[Path], dict]] = {}

CHEAP_GEN = {"gen_start": 1, "gen_every": 1, "gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 4}
# the all-methods check: digits with the small CNN at 16 px, 4 clients, half sampled per round, 2 rounds, on a
# class-stratified 400-image subset of the 1,437 training images (capped: it proves the same invariance)
ALL_METHODS_BASE = {"data.image_size": 16, "data.max_train_samples": 400, "partition.num_clients": 4,
                    "partition.args.beta": 0.5, "fed.rounds": 2, "fed.sample_ratio": 0.5}
# methods whose distinctive step would not happen in 2 rounds with their defaults
ALL_METHODS_ARGS = {"fedbm": CHEAP_GEN}
# methods scored another way (fed.protocol): the global model with per-client parts, client models
PROTOCOL_ROWS = [("fedrep", "global"), ("fedrod", "global"), ("fedproto", "local_mean")]


def base_cfg(root: Path, **overrides):
    """The tiny digits RunConfig (small CNN, 6 clients, 3 rounds, 1 thread; conftest.py's tiny_cfg builds it here),
    writing under root, with ``overrides`` (dotted keys)."""
    from bench.assembly.config import RunConfig

    cfg = RunConfig()
    cfg.data.name = "digits"
    cfg.data.cache_dir = str(root / "cache")
    cfg.partition.num_clients, cfg.partition.args = 6, {"beta": 0.5, "min_size": 20}
    cfg.fed.rounds, cfg.fed.sample_ratio, cfg.fed.batch_size = 3, 0.5, 32
    cfg.method.backbone, cfg.method.lr = "simple-cnn", 0.05
    cfg.output_dir, cfg.checkpoint_dir = str(root / "runs"), str(root / "ckpt")
    cfg.accelerator, cfg.threads, cfg.progress, cfg.save_final_state = "cpu", 1, False, True
    for key, value in overrides.items():
        obj = cfg
        *path, last = key.split(".")
        for p in path:
            obj = getattr(obj, p)
        if isinstance(obj, dict):  # an option of partition.args / method.args
            obj[last] = value
        else:
            setattr(obj, last, value)
    return with_scheme_args(cfg, overrides)


def with_scheme_args(cfg, overrides: dict):
    """``cfg`` with the base's partition.args kept only where its scheme takes them (as a table's base args reach
    only the columns whose scheme takes them): a case that switches to iid or natural drops beta and min_size;
    args the case sets itself stay (an unknown scheme keeps them all: its error comes first)."""
    from bench.core.registry import UnknownNameError
    from datamodules.partitions import option_defaults

    if "partition.args" in overrides:
        return cfg
    try:
        takes = set(option_defaults(cfg.partition.scheme))
    except UnknownNameError:
        return cfg
    cfg.partition.args = {k: v for k, v in cfg.partition.args.items()
                          if k in takes or f"partition.args.{k}" in overrides}
    return cfg


def case(name: str):
    def register(overrides: Callable[[Path], dict]) -> Callable[[Path], dict]:
        CASES[name] = overrides
        return overrides

    return register


def case_cfg(name: str, root: Path, devices: int, out: Path | None = None):
    """The config of case ``name`` on ``devices`` ranks; its data under root, its outputs under out (root)."""
    out = out or root
    return base_cfg(root, **CASES[name](root), experiment=f"{name}-{devices}", devices=devices,
                    output_dir=str(out / "runs"), checkpoint_dir=str(out / "ckpt"))


# ---- the cases ----------------------------------------------------------------------------------------
for _method, _args, _backbone in [("fedavg", {}, "resnet18"), ("fedprox", {"mu": 0.01}, "simple-cnn")]:
    case(f"rank_invariance-{_method}")(
        lambda root, m=_method, a=_args, b=_backbone: {"method.name": m, "method.args": a, "method.backbone": b})
case("rank_balance")(lambda root: {"partition.args.beta": 0.1, "fed.rounds": 3})
for _method, _args in [("fedbm", CHEAP_GEN), ("fednpr", {"num_subclusters": 2})]:
    case(f"float64-{_method}")(lambda root, m=_method, a=_args: {
        "method.name": m, "method.args": a, "partition.num_clients": 4, "fed.rounds": 2, "precision": "64-true"})
case("fednpr")(lambda root: {
    "method.name": "fednpr", "method.backbone": "simple-cnn", "data.image_size": 16, "partition.num_clients": 4,
    "fed.sample_ratio": 0.5, "fed.rounds": 3, "method.optimizer": "adam", "method.lr": 1e-3,
    "method.args": {"num_subclusters": 2}})
for _method, _args in [("facmic", {"optimizer": "adam", "lr": 1e-3}), ("fst-cbdg", {})]:
    case(f"clip-{_method}")(lambda root, m=_method, a=_args: {
        "method.name": m, "method.args": {"feature_cache_dir": str(root / "features")}, "fed.test_rounds": "all",
        **{f"method.{k}": v for k, v in a.items()}})
for _option, _value in [("channels_last", True), ("precision", "bf16-mixed"), ("compile", True)]:
    case(f"speed-{_option}")(lambda root, o=_option, v=_value: {"fed.rounds": 2, "partition.num_clients": 4, o: v})

case("resume_two_ranks")(lambda root: {"fed.rounds": 3, "checkpoint_every": 1, "fed.keep_optimizer_state": True})


@case("ich_split_file")
def _ich(root: Path) -> dict:
    from test_ich_split_file import build_rsna_csv, client_lists, write_client_split_file

    data, split = root / "ich", root / "ich_split.npy"
    if not split.exists():
        train, test = client_lists(build_rsna_csv(data))
        write_client_split_file(split, train, test)
    return {"data.name": "rsna-ich", "data.root": str(data), "data.image_size": 16,
            "data.client_split_file": str(split), "data.val_fraction": 0.0, "partition.scheme": "natural",
            "partition.num_clients": 3, "fed.client_test": "site", "method.name": "fedavg",
            "fed.protocol": "per_client", "fed.rounds": 2, "fed.sample_ratio": 1.0, "fed.batch_size": 8}


def all_methods_names() -> list[str]:
    from lightning_modules.base import METHODS

    return METHODS.names()


def _all_methods_cases() -> None:
    for method in all_methods_names():  # central rows: a federation of one client, which lives on rank 0
        case(f"all-{method}")(lambda root, m=method: {
            **ALL_METHODS_BASE, "method.name": m, "method.args": ALL_METHODS_ARGS.get(m, {})})
    for method, protocol in PROTOCOL_ROWS:
        case(f"all-{method}@{protocol}")(lambda root, m=method, p=protocol: {
            **ALL_METHODS_BASE, "method.name": m, "fed.protocol": p})


_all_methods_cases()


# ---- the shared launch --------------------------------------------------------------------------------
def launch_two_ranks(root: Path) -> dict[str, Path]:
    """Every case's 2-rank run in one launch; returns case -> its record path (the .json; the final state is
    the .pt beside it). A sitecustomize hook counts the ranks Fabric's launcher started (the positive control of
    tests/assembly/test_bad_files.py's "no rank was started")."""
    from conftest import rank_marking_env

    from bench.assembly.records import record_path

    cfgs = {name: case_cfg(name, root, devices=2) for name in CASES}
    env, marks = rank_marking_env(root)
    env["OMP_NUM_THREADS"] = "1"
    spec = root / "cases.json"
    spec.write_text(json.dumps([cfg.to_dict() for cfg in cfgs.values()]))
    done = subprocess.run([sys.executable, __file__, str(spec)], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False, timeout=3600)
    assert done.returncode == 0, f"the 2-rank launch failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    started = sorted(p.name.split("-")[0] for p in marks.iterdir())
    assert started == ["rank1"], started  # one rank 1 for the whole launch, seen by the hook
    return {name: record_path(cfg.output_dir, cfg.experiment, cfg.run_name()) for name, cfg in cfgs.items()}


def run_cases(path: str) -> int:
    """The launched program: every config of ``path``, grouped by precision, on one launch: the first group's
    Fabric launches the ranks, each later group's Fabric (its own precision plugin) joins the same ranks."""
    from bench.assembly.config import from_dict
    from bench.assembly.experiment import launch, make_fabric, run_experiment, wait_for_launched_ranks

    groups: dict[str, list] = {}
    for cfg in (from_dict(d) for d in json.loads(Path(path).read_text())):
        groups.setdefault(cfg.precision, []).append(cfg)
    launched = None
    for cfgs in groups.values():
        fabric = launch(make_fabric(cfgs[0]))
        launched = launched or fabric
        assert fabric.world_size == 2, fabric.world_size
        for cfg in cfgs:
            run_experiment(cfg, fabric)
    wait_for_launched_ranks(launched)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(run_cases(sys.argv[1]))

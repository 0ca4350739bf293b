"""The packages are layered one way: every import (module- or function-level, read with ast) of
bench, datamodules and lightning_modules goes to its own layer or one below it, so no package
imports one that imports it back. Inside bench/ the folders are the layers: bench.core at the bottom, then
(above datamodules and lightning_modules) the round engine (bench.engine), run assembly (bench.assembly),
what a table is (bench.tables), reporting it (bench.reporting), W&B tracking (bench.tracking), running a
table (bench.scheduling), the other subcommands (bench.commands), the performance tools (bench.perf) and the
CLI (bench/cli.py) on top; no other module lives loose in bench/."""
from __future__ import annotations

from conftest import REPO

from bench.core.code_version import imported_modules, module_name, module_path

# bottom to top: a module may import its own layer and the ones before it
LAYERS = ("bench.core", "datamodules", "lightning_modules", "bench.engine", "bench.assembly", "bench.tables",
          "bench.reporting", "bench.tracking", "bench.scheduling", "bench.commands", "bench.perf", "bench.cli")
PACKAGES = ("bench", "datamodules", "lightning_modules")


def layer(module: str) -> str | None:
    """The layer of a module of the three packages (None: a third-party or standard module)."""
    if module == "bench":  # the package's __init__: imports nothing (checked below)
        return "bench.core"
    for name in LAYERS:
        if module == name or module.startswith(name + "."):
            return name
    if module.startswith("bench."):
        return "bench (loose)"
    return None


def project_modules() -> dict[str, set[str]]:
    """module -> the project modules it imports (``from a import b``: a.b when that is a module, else a)."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            name = module_name(path, REPO)
            out[name] = {m for m in imported_modules(path, name)
                         if layer(m) is not None and module_path(m, REPO) is not None}
    return out


def violations(modules: dict[str, set[str]]) -> list[str]:
    bad = [f"{module} is in no layer: move it into one of bench's layer packages" for module in sorted(modules)
           if layer(module) not in LAYERS] + [f"{m} (loose) is imported by {module}" for module, imports in
                                              sorted(modules.items()) for m in sorted(imports) if layer(m) not in LAYERS]
    for module, imports in sorted(modules.items()):
        if layer(module) not in LAYERS:
            continue
        own = LAYERS.index(layer(module))
        bad += [f"{module} ({layer(module)}) imports {m} ({layer(m)})"
                for m in sorted(imports) if layer(m) in LAYERS and LAYERS.index(layer(m)) > own]
    return bad


def test_imports_only_go_down_the_layers():
    modules = project_modules()
    bad = violations(modules)
    assert not bad, "imports against the layering:\n" + "\n".join(bad)
    assert {layer(m) for m in modules} == set(LAYERS)
    assert modules["bench"] == set()


def test_the_check_sees_function_level_imports_and_upward_edges():
    modules = project_modules()
    assert "bench.assembly.experiment" in modules["bench.cli"]  # imported inside main()
    assert "bench.reporting.tables" in modules["bench.scheduling.table_runner"]  # inside main()
    assert violations({"datamodules.partition": {"bench.assembly.records"}}) == [
        "datamodules.partition (datamodules) imports bench.assembly.records (bench.assembly)"]
    assert violations({"bench.assembly.experiment": {"bench.tracking.wandb_logger"}}) != []
    assert violations({"bench.core.batches": {"datamodules.augment"}}) != []
    assert violations({"bench.engine.federation": {"bench.assembly.config"}}) != []  # the engine under assembly
    assert violations({"bench.assembly.experiment": {"bench.engine.federation"}}) == []
    assert violations({"bench.scheduling.table_runner": {"bench.perf.gpu_check"}}) != []  # tools measure, never serve
    assert violations({"bench.helpers": set()}) == [
        "bench.helpers is in no layer: move it into one of bench's layer packages"]


# The round engine (issue 40, "resolved once"): these modules read a RoundPlan / CheckpointPlan
# (bench/engine/round_plan.py) that the run's assembly resolves once (bench/assembly/run_plan.py), never the RunConfig
ROUND_ENGINE = tuple(f"bench.engine.{m}" for m in ("federation", "checkpoint", "round_plan", "aggregation", "evaluation",
                                                   "placement", "liveness", "health", "metrics", "val_scores"))


def test_the_round_engine_never_imports_the_run_config():
    modules = project_modules()

    def reach(module: str) -> set[str]:
        seen, todo = set(), [module]
        while todo:
            for m in modules.get(todo.pop(), ()):
                if m not in seen:
                    seen.add(m)
                    todo.append(m)
        return seen

    assembly = {"bench.assembly.config", "bench.assembly.run_plan", "bench.assembly.experiment"}
    assert {m: sorted(reach(m) & assembly) for m in ROUND_ENGINE} == {m: [] for m in ROUND_ENGINE}
    assert "bench.assembly.config" in reach("bench.assembly.run_plan")
    assert "bench.engine.round_plan" in reach("bench.assembly.experiment")


def test_no_round_engine_function_takes_the_run_config():
    """Nor is it handed the config duck-typed: no function of the round engine has a ``cfg`` parameter (the
    last one, health.idle_option_warnings, takes the rounds and lr milestones it reads)."""
    import ast

    taking = []
    for module in ROUND_ENGINE:
        tree = ast.parse(module_path(module, REPO).read_text())
        taking += [f"{module}.{node.name}" for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                   and "cfg" in {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}]
    assert taking == []
    assert ast.parse("def f(cfg): pass").body[0].args.args[0].arg == "cfg"  # the parameter as the check reads it


def test_the_readme_s_architecture_is_the_layer_order():
    """The README's architecture section lists the layers bottom to top, as LAYERS does."""
    import re

    section = (REPO / "README.md").read_text().split("## Architecture", 1)[1].split("\n## ", 1)[0]
    listed = [m.replace("/", ".").removesuffix(".py") for m in re.findall(r"^\d+\. `([\w/.]+)`", section, re.MULTILINE)]
    assert listed == list(LAYERS)

"""A run's code version covers what can change its numbers: the round engine (the import closure of
bench.assembly.experiment), its method's, data module's and partition scheme's import closures, each module by
its syntax tree without comments or docstrings. Every edit is made on a copy of the tree."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from bench.core.code_version import (
    LEGACY_FILE,
    Tree,
    changed_parts,
    closure,
    combine,
    declare_same,
    judge,
    legacy_version_of,
    legacy_versions,
    register_legacy,
    run_names,
)

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out

PACKAGES = ("bench", "datamodules", "lightning_modules")
LEGACY_COMMIT = "3fda314"  # the last commit with the whole-tree (legacy) code version


def copy_tree(root):
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return copy_tree(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def tree(tmp_path, pristine):
    """A fresh copy of the three packages, to edit."""
    return copy_tree(tmp_path)


def edit(root, rel, old, new):
    path = root / rel
    text = path.read_text()
    assert text.count(old) == 1, (rel, old)
    path.write_text(text.replace(old, new))


def run(method="fedavg", data="digits", scheme="dirichlet", test_dataset=None):
    return {"method": {"name": method}, "data": {"name": data, "test_dataset": test_dataset},
            "partition": {"scheme": scheme}}


def test_the_engine_is_the_round_core_without_the_registered_modules(pristine):
    t = Tree(pristine)
    engine = {p.relative_to(pristine).as_posix() for p in t.engine_files}
    assert {"bench/assembly/experiment.py", "bench/engine/federation.py", "bench/engine/aggregation.py", "bench/assembly/records.py",
            "bench/core/seeding.py", "lightning_modules/base.py", "datamodules/base.py",
            "datamodules/partition.py"} <= engine
    assert not any(f.startswith(f"bench/{pkg}/") for f in engine
                   for pkg in ("tables", "reporting", "tracking", "scheduling", "commands", "perf"))
    assert not {"bench/cli.py", "bench/core/code_version.py", "lightning_modules/fedrs.py", "lightning_modules/fedavg.py",
                "datamodules/digits.py", "datamodules/partitions/dirichlet.py"} & engine
    fedbabu_npr = closure([t.registered["method"]["fedbabu-npr"]], t.graph, pristine) - t.engine_files
    assert {p.relative_to(pristine).as_posix() for p in fedbabu_npr} >= {
        "lightning_modules/fedbabu_npr.py", "lightning_modules/fedbabu.py", "lightning_modules/components/npr.py"}
    assert len(t.registered["method"]) >= 40 and {"digits", "fashion-mnist"} <= set(t.registered["data"])


def test_a_docstring_or_comment_edit_changes_no_version(tree, pristine):
    before = Tree(pristine).parts()
    edit(tree, "lightning_modules/fedrs.py", '"""Per-class logit scales alpha_c [C]."""',
         '"""The per-class logit scales alpha_c [C] (reworded)."""  # and a comment')
    edit(tree, "lightning_modules/fedrs.py", "class FedRS(FederatedModule):\n",
         'class FedRS(FederatedModule):\n    """A class docstring that was not there."""\n\n    # a comment\n')
    edit(tree, "lightning_modules/fedrs.py", "FedAvg whose local softmax", "FedAvg, whose local softmax")
    edit(tree, "bench/engine/federation.py", "from __future__ import annotations\n",
         "from __future__ import annotations  # a comment\n\n\n")
    edit(tree, "datamodules/partitions/dirichlet.py", "from __future__ import annotations\n",
         'from __future__ import annotations\n\n"""a bare string is not code"""\n')
    after = Tree(tree).parts()
    assert after == before  # every part: so no run's version and no record's staleness changes
    assert Tree(tree).version(run("fedrs")) == Tree(pristine).version(run("fedrs"))


def test_an_edit_to_fedrs_loss_changes_fedrs_runs_only(tree, pristine):
    edit(tree, "lightning_modules/fedrs.py", "F.cross_entropy(self.restricted_logits(batch[0], scales), batch[1])",
         "F.cross_entropy(self.restricted_logits(batch[0], scales), batch[1], label_smoothing=0.1)")
    old, new = Tree(pristine), Tree(tree)
    assert changed_parts(old.parts(), new.parts()) == ["method:fedrs"]
    assert new.version(run("fedrs")) != old.version(run("fedrs"))
    for other in ("fedavg", "fedprox", "fednpr", "fedbm"):
        assert new.version(run(other)) == old.version(run(other))


def test_a_component_edit_changes_the_methods_that_import_it(tree, pristine):
    edit(tree, "lightning_modules/components/npr.py", "from __future__ import annotations\n",
         "from __future__ import annotations\nEDITED = 1\n")
    changed = changed_parts(Tree(pristine).parts(), Tree(tree).parts())
    assert {"method:fednpr", "method:fedavg-npr", "method:fedbabu-npr", "method:fedrep-npr"} <= set(changed)
    assert "engine" not in changed and "method:fedavg" not in changed and "method:fedrs" not in changed
    assert all(part.startswith("method:") for part in changed)


@pytest.mark.parametrize(("rel", "expected"), [
    ("bench/engine/aggregation.py", ["engine"]),  # the round engine: every run
    ("bench/assembly/records.py", ["engine"]),
    ("datamodules/digits.py", ["data:digits"]),
    ("datamodules/partitions/dirichlet.py", ["partition:dirichlet", "partition:dirichlet_missing"]),
    ("bench/reporting/tables.py", []),  # above the engine: no run
    ("bench/cli.py", []),
    ("bench/core/code_version.py", []),  # the identity itself
])
def test_a_code_edit_changes_the_parts_that_import_it(tree, pristine, rel, expected):
    edit(tree, rel, "from __future__ import annotations\n", "from __future__ import annotations\nEDITED = 1\n")
    old, new = Tree(pristine), Tree(tree)
    assert changed_parts(old.parts(), new.parts()) == expected
    changed_runs = {m for m in ("fedavg", "fedrs", "fedbm") if new.version(run(m)) != old.version(run(m))}
    assert changed_runs == ({"fedavg", "fedrs", "fedbm"} if expected else set())  # digits, dirichlet


def test_a_run_names_its_parts_from_its_config(tiny_cfg, pristine):
    cfg = tiny_cfg()
    names = run_names(cfg)
    assert names == run_names(cfg.to_dict()) == {"method": [cfg.method.name], "data": [cfg.data.name],
                                                  "partition": [cfg.partition.scheme]}
    assert run_names(run("fedavg", test_dataset="fashion-mnist"))["data"] == ["digits", "fashion-mnist"]
    t = Tree(pristine)
    assert t.version(run("fedavg", test_dataset="fashion-mnist")) != t.version(run("fedavg"))
    assert t.version(run("no-such-method")) is None


def legacy_tree(root):
    """A copy of this tree that stamps records as the last legacy commit did (its bench/code_version.py)."""
    copy_tree(root)
    old = subprocess.run(["git", "show", f"{LEGACY_COMMIT}:bench/code_version.py"], cwd=REPO, check=True,
                         capture_output=True).stdout
    (root / "bench" / "code_version.py").write_bytes(old)
    return root


def test_legacy_records_are_judged_by_the_parts_of_the_tree_that_wrote_them(tmp_path):
    wrote = legacy_tree(tmp_path / "wrote")
    file = tmp_path / "legacy.json"
    stamp = register_legacy(wrote, "the tree that wrote them", file=file)
    assert len(stamp) == 12 and stamp == legacy_version_of(wrote)
    legacy = __import__("json").loads(file.read_text())["versions"]
    assert legacy[stamp]["tree"] == "the tree that wrote them"
    now = copy_tree(tmp_path / "now")  # the same code, stamped by the new scheme
    edit(now, "lightning_modules/fedrs.py", "torch.ones_like(counts), torch.full_like(counts, alpha)",
         "torch.ones_like(counts), torch.full_like(counts, alpha * 0.5)")
    t = Tree(now)
    assert judge(stamp, run("fedavg"), legacy, t) and judge(stamp, run("fedbm", "fashion-mnist", "iid"), legacy, t)
    assert not judge(stamp, run("fedrs"), legacy, t)  # its loss changed since
    assert not judge("0123456789ab", run("fedavg"), legacy, t)  # an unknown legacy version: changed code
    assert judge(t.version(run("fedrs")), run("fedrs"), legacy, t)


def test_a_declared_migration_counts_legacy_records_as_made_with_this_code(tmp_path):
    wrote = legacy_tree(tmp_path / "wrote")
    now = copy_tree(tmp_path / "now")
    edit(now, "bench/engine/aggregation.py", "from __future__ import annotations\n",
         "from __future__ import annotations\nREFACTORED = 1\n")
    file = tmp_path / "legacy.json"
    stamp = register_legacy(wrote, "wrote", declared="a refactor", file=file, current=now)
    legacy = __import__("json").loads(file.read_text())["versions"]
    assert legacy[stamp]["declared"] == "a refactor" and legacy[stamp]["changed_since_tree"] == ["engine"]
    assert judge(stamp, run("fedrs"), legacy, Tree(now))
    edit(now, "lightning_modules/fedrs.py", "alpha: float = 0.5", "alpha: float = 0.25")
    assert not judge(stamp, run("fedrs"), legacy, Tree(now)) and judge(stamp, run("fedavg"), legacy, Tree(now))


def test_the_committed_migration_is_the_legacy_commit_declared_for_its_parts(tmp_path):
    """legacy_code_versions.json: the key is the version the legacy commit stamped, the list of parts changed
    since it is what that commit's parts and the declared ones give."""
    archive = subprocess.run(["git", "archive", LEGACY_COMMIT, *PACKAGES], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    stamp = legacy_version_of(tmp_path)
    entry = legacy_versions()[stamp]
    assert stamp == "c78d9d36c5aa" and LEGACY_COMMIT in entry["tree"]
    assert entry["changed_since_tree"] == changed_parts(Tree(tmp_path).parts(), entry)
    assert combine(entry, run_names(run("fedrs"))) is not None and LEGACY_FILE.name == "legacy_code_versions.json"


def declarations(file):
    return __import__("json").loads(file.read_text()).get("same", {})


def test_a_declared_engine_refactor_keeps_records_current_until_an_undeclared_change(tmp_path):
    wrote = copy_tree(tmp_path / "wrote")  # the tree that stamped the records
    stamps = {m: Tree(wrote).version(run(m)) for m in ("fedrs", "fedavg")}
    now = copy_tree(tmp_path / "now")
    edit(now, "bench/engine/aggregation.py", "from __future__ import annotations\n",
         "from __future__ import annotations\nREFACTORED = 1\n")
    assert not judge(stamps["fedrs"], run("fedrs"), {}, Tree(now))  # an engine edit stales every record
    file = tmp_path / "legacy.json"
    assert declare_same(wrote, "before the refactor", "regression references unchanged", file=file,
                        current=now) == ["engine"]
    same = declarations(file)
    assert same["engine"][Tree(wrote).engine] == {"same_as": Tree(now).engine, "tree": "before the refactor",
                                                  "declared": "regression references unchanged"}
    assert all(judge(stamps[m], run(m), {}, Tree(now), same) for m in stamps)
    assert judge(Tree(now).version(run("fedrs")), run("fedrs"), {}, Tree(now), same)  # new records too
    edit(now, "lightning_modules/fedrs.py", "alpha: float = 0.5", "alpha: float = 0.25")
    assert not judge(stamps["fedrs"], run("fedrs"), {}, Tree(now), same)  # FedRS's own change: not declared
    assert judge(stamps["fedavg"], run("fedavg"), {}, Tree(now), same)
    assert not judge(stamps["fedavg"], run("fedavg", "fashion-mnist"), {}, Tree(now), same)  # another run's stamp


def test_declarations_chain_and_never_cover_a_later_undeclared_edit(tmp_path):
    wrote = copy_tree(tmp_path / "wrote")
    stamp = Tree(wrote).version(run("fedavg"))
    middle = copy_tree(tmp_path / "middle")
    edit(middle, "bench/engine/aggregation.py", "from __future__ import annotations\n",
         "from __future__ import annotations\nFIRST = 1\n")
    file = tmp_path / "legacy.json"
    declare_same(wrote, "first", "proof one", file=file, current=middle)
    now = copy_tree(tmp_path / "now")
    shutil.copy(middle / "bench/engine/aggregation.py", now / "bench/engine/aggregation.py")
    edit(now, "bench/engine/aggregation.py", "FIRST = 1\n", "FIRST = 1\nSECOND = 2\n")
    assert not judge(stamp, run("fedavg"), {}, Tree(now), declarations(file))  # the second edit: undeclared
    declare_same(middle, "second", "proof two", file=file, current=now)
    assert judge(stamp, run("fedavg"), {}, Tree(now), declarations(file))  # wrote -> middle -> now


def test_a_declaration_also_carries_legacy_records(tmp_path):
    wrote = legacy_tree(tmp_path / "wrote")
    file = tmp_path / "legacy.json"
    stamp = register_legacy(wrote, "legacy", file=file)
    now = copy_tree(tmp_path / "now")
    edit(now, "bench/engine/aggregation.py", "from __future__ import annotations\n",
         "from __future__ import annotations\nREFACTORED = 1\n")
    legacy = __import__("json").loads(file.read_text())["versions"]
    assert not judge(stamp, run("fedavg"), legacy, Tree(now))
    declare_same(copy_tree(tmp_path / "before"), "before", "a refactor", file=file, current=now)
    assert judge(stamp, run("fedavg"), legacy, Tree(now), declarations(file))


def test_declare_same_needs_a_reason_and_the_command_says_how(tmp_path):
    with pytest.raises(SystemExit, match="needs WHY"):
        declare_same(tmp_path, "note", "  ", file=tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()
    out = subprocess.run([sys.executable, "-m", "bench.core.code_version", "declare-same", str(tmp_path)], cwd=REPO, check=False,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "declare-same TREE NOTE WHY" in out.stderr

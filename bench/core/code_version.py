"""The code version a run record was computed with: a hash of the code that can change its numbers.

A table rerun skips a run only when its record has the same result-config and the same code
version; a resume needs the same version too. A run's version hashes four parts, each the static
import closure (module- and function-level imports read with ``ast``, followed within this
repository) of

- the round engine: ``bench.assembly.experiment`` (the round loop, aggregation, evaluation, records, the
  base classes of methods and data modules, the partitioner), without the modules the registries
  discover (those are parts of their own);
- the method: the module registering ``method.name`` (``@METHODS.register("fedrs")``) and what it
  imports (its components, the classes it extends);
- the data module(s): the module registering ``data.name`` (and ``data.test_dataset``);
- the partition scheme: the module registering ``partition.scheme``.

Each module counts by its name and its normalised syntax tree: comments, docstrings and other bare
strings, line numbers and layout do not count. What is read of a module's source (imports, registrations,
normalised digest) is kept by content under ``$FEDBENCH_CACHE/code-parse`` (``source_facts``): a process
parses only the modules it has not seen, not all of them (0.8-1.0 s of every run's start). So a docstring
edit changes no version, an edit to FedRS's loss changes the version of FedRS's runs only, and an edit to the
round engine changes every run's. ``bench/tables``, ``bench/reporting``, ``bench/tracking``, ``bench/scheduling``, ``bench/commands``,
``bench/perf`` and ``bench/cli.py`` sit above the engine (tests/core/test_layering.py) and are outside every
closure; this module (the identity itself) is left out too. Registrations are found
statically, so the version of any tree (a temporary copy in the tests) is computed without importing it.

Records written before this scheme carry a whole-tree hash of raw bytes (the *legacy* version).
They are judged by a compatible rule, without rewriting any record: ``legacy_code_versions.json``
maps each known legacy version to parts, so such a record is current exactly when the parts its run
depends on equal this checkout's. A tree registered as it is keeps its own parts; a tree registered
with a declaration (a one-time migration: the changes since it move no number) gets the parts of the
checkout that declared it, and lists the parts that differed (``changed_since_tree``) for review.
``python -m bench.core.code_version register-legacy TREE NOTE [WHY]`` adds one. An unknown legacy version
counts as changed code. The entry for commit 3fda314 (``c78d9d36c5aa``) is declared: since it, only
this identity and bench/core/compat.py changed (the engine and FedBM's part).

A change that moves no number (a refactor of the engine, a file moved, a faster formula with the same
bits) can be *declared* so that records and checkpoints keep counting as current:
``python -m bench.core.code_version declare-same TREE NOTE WHY`` compares the parts of TREE (a checkout of
the code before the change) with this checkout's and records, for each part that differs, "TREE's hash
is the same code as this one" with the reason (the proof: which regression references and equivalence
tests passed unchanged). A record is then current when its version is the one this checkout gives
with any of its parts replaced by a hash declared (directly, or through a chain of declarations) the
same as this checkout's. Declarations never carry over to a later undeclared change: a part edited
after a declaration has a hash nothing is declared equal to, and its runs go stale.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.core.atomic_io import claim_json
from bench.core.errors import FedbenchError
from bench.core.paths import DEFAULT_CACHE_DIR, REPO_ROOT

# the round engine's root module; a tree from before bench/'s modules moved into layer packages (bench.engine,
# bench.assembly) has it as bench.experiment (declare-same reads such trees)
ENGINE = "bench.assembly.experiment"
ENGINE_BEFORE_THE_MOVE = "bench.experiment"
PACKAGES = ("bench", "datamodules", "lightning_modules")
# the identity itself, here and where it lived before the move: it changes no number
IDENTITY_MODULES = frozenset({"bench.core.code_version", "bench.code_version"})
# part kind -> (the folder whose modules the registry discovers, the registry's name)
REGISTRIES = {"method": ("lightning_modules", "METHODS"), "data": ("datamodules", "DATASETS"),
              "partition": ("datamodules/partitions", "PARTITION_SCHEMES")}
LEGACY_FILE = Path(__file__).with_name("legacy_code_versions.json")
# what source_facts keeps per module content; the Python version is in the name (its parser makes the trees)
PARSE_CACHE_FORMAT = 1
PARSE_CACHE = Path(DEFAULT_CACHE_DIR) / "code-parse" / f"py{sys.version_info[0]}.{sys.version_info[1]}-{PARSE_CACHE_FORMAT}"


def module_name(path: Path, root: Path) -> str:
    """``bench/core/errors.py`` -> ``bench.core.errors``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str, root: Path) -> Path | None:
    """The file of module ``name`` under ``root``, or None (a third-party module, or not a module)."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """Every module the source file of ``module`` imports, at module or function level (relative
    imports resolved); ``from a import b`` yields ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return set(imports_in(path.read_bytes(), package))


def imports_in(source: bytes, package: str) -> frozenset[str]:
    """The modules a source imports (see imported_modules), relative imports resolved from ``package``."""
    out: set[str] = set()
    for kind, module, level, names in source_facts(source)["imports"]:
        if kind == "import":
            out.update(names)
            continue
        base = module
        if level:
            parent = package.split(".")[: len(package.split(".")) - level + 1]
            base = ".".join(parent + ([module] if module else []))
        out.add(base)
        out.update(f"{base}.{name}" for name in names)
    return frozenset(out)


def import_graph(root: Path) -> dict[Path, set[Path]]:
    """Every module of the tree's packages -> the modules within the tree it imports (and the
    ``__init__.py`` of every package on the way)."""
    files = [p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")]
    found: dict[str, Path | None] = {}

    def resolve(name: str) -> Path | None:  # only the three packages (installed, root is site-packages)
        if name not in found:
            found[name] = module_path(name, root) if name.split(".")[0] in PACKAGES else None
        return found[name]

    graph = {}
    for path in files:
        names = imported_modules(path, module_name(path, root))
        graph[path] = {dep for name in names for i in range(1, name.count(".") + 2)
                       if (dep := resolve(".".join(name.split(".")[:i]))) is not None}
    return graph


def closure(start: list[Path], graph: dict[Path, set[Path]], root: Path, skip: frozenset[Path] = frozenset()) -> set[Path]:
    """The files of ``start`` and every module they import within the tree, not following into
    ``skip`` or the identity modules."""
    todo, seen = list(start), set()
    while todo:
        path = todo.pop()
        if path in seen or path in skip or module_name(path, root) in IDENTITY_MODULES:
            continue
        seen.add(path)
        todo.extend(graph.get(path, ()))
    return seen


def registered_names(path: Path, registry: str) -> list[str]:
    """The names a module registers: ``@REGISTRY.register("name")`` or ``REGISTRY.register("name")(...)``."""
    return list(names_registered(path.read_bytes(), registry))


def names_registered(source: bytes, registry: str) -> tuple[str, ...]:
    return tuple(name for reg, name in source_facts(source)["registers"] if reg == registry)


def registrations(root: Path) -> dict[str, dict[str, Path]]:
    """kind -> registered name -> the module registering it: the modules each registry discovers (the
    top-level modules of its folder not starting with ``_``), read statically."""
    out: dict[str, dict[str, Path]] = {}
    for kind, (folder, registry) in REGISTRIES.items():
        out[kind] = {name: path for path in sorted((root / folder).glob("[!_]*.py"))
                     for name in registered_names(path, registry)}
    return out


def bare_string(node: Any) -> bool:
    """A statement that is only a string (a docstring, an attribute docstring): it does nothing."""
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def canonical(node: Any) -> str:
    """A stable text of a syntax tree: node types and their non-empty fields, without positions,
    comments (the parser drops them) or bare string statements (unlike ``ast.dump``, the same across
    Python versions that only add optional fields)."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={canonical(value)}" for name in node._fields
                  if (value := getattr(node, name, None)) is not None and value != []]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(canonical(item) for item in node if not bare_string(item))}]"
    return repr(node)


def normalised_digest(source: bytes) -> str:
    """The SHA-1 of a module's source with comments, docstrings and layout taken out."""
    return source_facts(source)["digest"]


def parse_facts(source: bytes) -> dict[str, Any]:
    """What the identity reads of a module's source, from its syntax tree: its import statements (["import",
    "", 0, names] or ["from", module, level, names]), the ``REGISTRY.register("name")`` calls ([registry, name]),
    both in ``ast.walk`` order, and the normalised digest."""
    tree, imports, registers = ast.parse(source), [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.append(["import", "", 0, [alias.name for alias in node.names]])
        elif isinstance(node, ast.ImportFrom):
            imports.append(["from", node.module or "", node.level, [alias.name for alias in node.names]])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register" \
                and isinstance(node.func.value, ast.Name) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            registers.append([node.func.value.id, node.args[0].value])
    return {"imports": imports, "registers": registers,
            "digest": hashlib.sha1(canonical(tree).encode()).hexdigest()}


@functools.cache
def source_facts(source: bytes) -> dict[str, Any]:
    """``parse_facts`` of a source, parsed once per content: kept in ``PARSE_CACHE`` under the content's
    SHA-256 (written once, whole or not at all), so that a later process reads 188 small files instead of
    parsing every module of the tree (0.8-1.0 s of every run's start). A missing, unreadable or foreign entry
    is parsed again; a cache folder that cannot be written only costs the parse."""
    key = hashlib.sha256(source).hexdigest()
    path = PARSE_CACHE / f"{key}.json"
    try:
        cached = json.loads(path.read_text())
        if cached.get("sha256") == key and {"imports", "registers", "digest"} <= cached.keys():
            return cached
    except (OSError, ValueError, AttributeError):
        pass
    facts = {"sha256": key, **parse_facts(source)}
    try:
        claim_json(path, facts)
    except (OSError, FedbenchError):
        pass
    return facts


def part_hash(files: set[Path], root: Path) -> str:
    """12 hex digits over (module name, normalised source) of ``files``, in module-name order."""
    digest = hashlib.sha1()
    for name, path in sorted((module_name(p, root), p) for p in files):
        digest.update(f"{name}\0{normalised_digest(path.read_bytes())}\0".encode())
    return digest.hexdigest()[:12]


class Tree:
    """The parts of the tree at ``root``, each computed when first asked for."""

    def __init__(self, root: Path) -> None:
        self.root, self.graph, self.registered = root, import_graph(root), registrations(root)
        discovered = frozenset(p for names in self.registered.values() for p in names.values())
        engine = module_path(ENGINE, root) or module_path(ENGINE_BEFORE_THE_MOVE, root)
        self.engine_files = closure([engine], self.graph, root, skip=discovered)
        self.engine = part_hash(self.engine_files, root)
        self.hashes: dict[tuple[str, str], str | None] = {}

    def part(self, kind: str, name: str) -> str | None:
        """The hash of a registered module's closure beyond the engine, or None (nothing registers it)."""
        if (kind, name) not in self.hashes:
            path = self.registered[kind].get(name)
            self.hashes[kind, name] = None if path is None else \
                part_hash(closure([path], self.graph, self.root) - self.engine_files, self.root)
        return self.hashes[kind, name]

    def parts(self) -> dict[str, Any]:
        """Every part: ``engine``, and kind -> registered name -> hash."""
        return {"engine": self.engine, **{kind: {name: self.part(kind, name) for name in names}
                                           for kind, names in self.registered.items()}}

    def version(self, cfg: Any) -> str | None:
        """A run's code version (RunConfig or its dict), or None when nothing registers one of its names."""
        names = run_names(cfg)
        return combine({"engine": self.engine, **{kind: {n: self.part(kind, n) for n in kind_names}
                                                  for kind, kind_names in names.items()}}, names)


def run_names(cfg: Any) -> dict[str, list[str]]:
    """kind -> the registered names a run uses, from a RunConfig or its ``to_dict()``."""
    get = (lambda group, key: (cfg.get(group) or {}).get(key)) if isinstance(cfg, dict) \
        else (lambda group, key: getattr(getattr(cfg, group), key))
    data = [get("data", "name")] + ([get("data", "test_dataset")] if get("data", "test_dataset") else [])
    return {"method": [get("method", "name")], "data": data, "partition": [get("partition", "scheme")]}


def run_parts(parts: dict[str, Any], names: dict[str, list[str]]) -> list[tuple[str, str]] | None:
    """The (part, hash) pairs a run depends on, in version order (``engine``, ``method:fedrs``, ...), or
    None when the tree has no module registering one of the names."""
    chosen = [("engine", parts["engine"])]
    for kind, kind_names in names.items():
        for name in kind_names:
            if parts[kind].get(name) is None:
                return None
            chosen.append((f"{kind}:{name}", parts[kind][name]))
    return chosen


def digest(chosen: list[tuple[str, str]]) -> str:
    return hashlib.sha1(json.dumps(chosen).encode()).hexdigest()[:12]


def combine(parts: dict[str, Any], names: dict[str, list[str]]) -> str | None:
    """A run's code version from a tree's parts: 12 hex digits over the engine and the run's named
    parts, or None when the tree has no module registering one of the names."""
    chosen = run_parts(parts, names)
    return None if chosen is None else digest(chosen)


def compute_code_version(cfg: Any, root: Path = REPO_ROOT) -> str | None:
    """The code version of a run (RunConfig or its dict) in the tree at ``root``, read afresh."""
    return Tree(root).version(cfg)


@functools.cache
def current_tree() -> Tree:
    """This checkout (read once per process)."""
    return Tree(REPO_ROOT)


def code_version(cfg: Any) -> str:
    """The code version of a run in this checkout (``unregistered`` for a name no module registers:
    validation refuses such a run before it starts)."""
    return current_tree().version(cfg) or "unregistered"


@functools.cache
def legacy_versions() -> dict[str, dict[str, Any]]:
    """legacy version -> the parts of the tree that wrote it (legacy_code_versions.json)."""
    return json.loads(LEGACY_FILE.read_text())["versions"]


@functools.cache
def declared_same() -> dict[str, dict[str, dict[str, str]]]:
    """part -> earlier hash -> {same_as: a later hash, tree, declared} (legacy_code_versions.json)."""
    return json.loads(LEGACY_FILE.read_text()).get("same", {})


def same_code(recorded: str | None, cfg: Any) -> bool:
    """Whether a record or checkpoint stamped ``recorded`` was computed with this checkout's code for
    its run: the same version, or one whose parts are this checkout's or declared the same (a known
    legacy version is judged by the parts of the tree that wrote it)."""
    return judge(recorded, cfg, legacy_versions(), current_tree(), declared_same())


def accepted(part: str, current: str, same: dict[str, dict[str, dict[str, str]]]) -> list[str]:
    """``current`` and every hash of ``part`` declared the same as it, directly or through a chain."""
    out, grew = [current], True
    while grew:
        grew = False
        for earlier, entry in same.get(part, {}).items():
            if entry["same_as"] in out and earlier not in out:
                out.append(earlier)
                grew = True
    return out


def judge(recorded: str | None, cfg: Any, legacy: dict[str, dict[str, Any]], tree: Tree,
          same: dict[str, dict[str, dict[str, str]]] | None = None) -> bool:
    """same_code against the legacy versions ``legacy``, the tree ``tree`` and the declarations ``same``."""
    names = run_names(cfg)
    now = run_parts({"engine": tree.engine, **{kind: {n: tree.part(kind, n) for n in kind_names}
                                                for kind, kind_names in names.items()}}, names)
    if now is None or not recorded:
        return False
    choices = [accepted(part, h, same or {}) for part, h in now]
    entry = legacy.get(recorded)
    if entry:
        then = run_parts(entry, names)
        return then is not None and all(h in ok for (_, h), ok in zip(then, choices))
    return any(digest([(part, h) for (part, _), h in zip(now, pick)]) == recorded
               for pick in itertools.product(*choices))


def legacy_version_of(tree: Path) -> str:
    """The legacy (whole-tree, raw bytes) version of ``tree``, computed by that tree's own code."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from bench.code_version import code_version; print(code_version())")  # a legacy tree's own module
    out = subprocess.run([sys.executable, "-c", code, str(tree)], cwd=tree, check=True, capture_output=True,
                         text=True)
    return out.stdout.strip()


def changed_parts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The parts (``engine``, ``method:fedrs``, ...) whose hashes differ between two trees' parts."""
    out = ["engine"] if old["engine"] != new["engine"] else []
    return out + [f"{kind}:{name}" for kind in REGISTRIES for name in sorted(set(old[kind]) | set(new[kind]))
                  if old[kind].get(name) != new[kind].get(name)]


def register_legacy(tree: Path, note: str, declared: str | None = None, file: Path = LEGACY_FILE,
                    current: Path = REPO_ROOT) -> str:
    """Add the tree that wrote legacy records to ``file``: its legacy version -> its parts. With
    ``declared`` (why the changes since that tree move no number), the parts of the ``current`` tree
    instead: a one-time migration that counts those records as made with this code; the parts that
    differ are listed for review."""
    version, parts = legacy_version_of(tree), Tree(tree).parts()
    entry: dict[str, Any] = {"tree": note, **parts}
    if declared:
        now = Tree(current).parts()
        entry = {"tree": note, "declared": declared, "changed_since_tree": changed_parts(parts, now), **now}
    data = json.loads(file.read_text()) if file.exists() else {"versions": {}}
    data["versions"][version] = entry
    file.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return version


def declare_same(tree: Path, note: str, declared: str, file: Path = LEGACY_FILE, current: Path = REPO_ROOT) -> list[str]:
    """Declare that the changes from ``tree`` (a checkout before them) to ``current`` move no number: for
    each part whose hash differs (and exists in both), record ``tree``'s hash as the same as ``current``'s,
    with ``note`` (which tree) and ``declared`` (why: the proof). Returns the parts declared."""
    if not declared.strip():
        raise SystemExit("declare-same needs WHY: which regression references and equivalence tests passed "
                         "unchanged on this checkout")
    old, now = Tree(tree).parts(), Tree(current).parts()
    data = json.loads(file.read_text()) if file.exists() else {"versions": {}}
    same = data.setdefault("same", {})
    parts = [p for p in changed_parts(old, now) if lookup(old, p) is not None and lookup(now, p) is not None]
    for part in parts:
        same.setdefault(part, {})[lookup(old, part)] = {"same_as": lookup(now, part), "tree": note,
                                                        "declared": declared}
    file.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return parts


def lookup(parts: dict[str, Any], part: str) -> str | None:
    """The hash of ``part`` (``engine`` or ``kind:name``) in a tree's parts."""
    if part == "engine":
        return parts["engine"]
    kind, name = part.split(":", 1)
    return parts[kind].get(name)


USAGE = """usage: python -m bench.core.code_version register-legacy TREE NOTE [WHY]
       python -m bench.core.code_version declare-same TREE NOTE WHY
  register-legacy: TREE is a checkout that wrote records with a legacy (whole-tree) code version; NOTE:
  which one it is; WHY: declare that the changes from TREE to this checkout move no number (its records
  then count as made with this checkout's parts); without WHY they keep TREE's own parts.
  declare-same: TREE is a checkout from before a change that moves no number (per-part versions); each
  part that differs is declared the same as this checkout's, so TREE's records and checkpoints stay
  current. WHY is the proof (which regression references and equivalence tests passed unchanged)."""

if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "register-legacy" and len(sys.argv) in (4, 5):
        print(register_legacy(Path(sys.argv[2]).resolve(), sys.argv[3], *sys.argv[4:]))
    elif command == "declare-same" and len(sys.argv) == 5:
        print("declared the same:", ", ".join(declare_same(Path(sys.argv[2]).resolve(), *sys.argv[3:])) or "nothing differs")
    else:
        sys.exit(USAGE)

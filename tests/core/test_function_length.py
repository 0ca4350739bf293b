"""No function longer than a screen (issue 29, done-when): every function in bench/, datamodules/ and
lightning_modules/ has at most 60 lines, counted from its `def` to its last line (docstring included)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 60


def long_functions(root: Path) -> list[str]:
    out = []
    for package in ("bench", "datamodules", "lightning_modules"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = node.end_lineno - node.lineno + 1
                    if length > LIMIT:
                        out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_is_longer_than_a_screen():
    assert long_functions(REPO) == []


def test_the_check_counts_a_long_function(tmp_path):
    (tmp_path / "bench").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "bench" / "long.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path) == [f"bench/long.py:1 long ({LIMIT + 1} lines)"]

"""requirements.lock (what `make install` installs with --no-deps) pins every dependency of
pyproject.toml, within pyproject's ranges, so the lock cannot silently miss a newly added package."""
from __future__ import annotations

import tomllib

from conftest import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and " " not in line, f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def test_lock_pins_every_dependency_within_its_range():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    pins = locked()
    for req in declared:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is in pyproject.toml but not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), f"lock pins {name}=={pins[name]}, outside {req}"
    # the numerical stack every record names, and the build tool torch requires at run time
    assert {"torch", "torchvision", "lightning", "timm", "transformers", "open-clip-torch", "torchmetrics",
            "setuptools"} <= set(pins)

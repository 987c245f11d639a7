"""The installed project imports its own top-level packages, not foreign ones of the same name."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib, json
out = {}
for name in ("asr_service", "adapters"):
    m = importlib.import_module(name)
    out[name] = m.__file__
import adapters
out["has_whisper_adapter"] = hasattr(adapters, "WhisperAdapter")
print(json.dumps(out))
"""


def test_installed_project_imports_its_own_packages(tmp_path):
    # Run from an unrelated directory so only the installed distribution can satisfy the
    # imports (a foreign PyPI package is also called "adapters").
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, check=True)
    found = __import__("json").loads(done.stdout)
    assert found.pop("has_whisper_adapter") is True
    for name, file in found.items():
        assert Path(file).resolve().is_relative_to(ROOT / name), (name, file)


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "asr-service"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "transcribe" in done.stdout


def _requirements(distribution: str, extra: str | None = None) -> set[str]:
    """Names of what ``distribution`` requires (with ``extra``: what only that extra adds)."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    names = set()
    for line in requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        wanted = (marker is None or marker.evaluate({"extra": ""})) if extra is None else (
            marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate({"extra": ""}))
        if wanted:
            names.add(canonicalize_name(requirement.name))
    return names


def canonicalize_name(name: str) -> str:
    from packaging.utils import canonicalize_name as canonical

    return canonical(name)


def _serving_closure() -> set[str]:
    """Every distribution `pip install -e .` brings: the project's requirements, theirs, ..."""
    from importlib.metadata import PackageNotFoundError

    seen, todo = set(), list(_requirements("asr-service"))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += _requirements(name)
        except PackageNotFoundError:  # a requirement of another platform
            pass
    return seen


def _not_for_serving() -> list[str]:
    """Top-level modules of the dev and bench extras that serving's own install does not bring."""
    from importlib.metadata import packages_distributions

    extras = (_requirements("asr-service", "dev") | _requirements("asr-service", "bench")) - _serving_closure()
    modules = [module for module, distributions in packages_distributions().items()
               if any(canonicalize_name(d) in extras for d in distributions) and module.isidentifier()]
    return sorted(modules) + ["support"]  # the tests' own helpers


SERVING_IMPORTS = """
import importlib, importlib.abc, pathlib, sys
blocked = set(sys.argv[1].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not a serving dependency")

sys.meta_path.insert(0, Refuse())
modules = []
root = pathlib.Path(sys.argv[2])
for top in ("asr_service", "adapters"):
    for file in sorted((root / top).rglob("*.py")):  # namespace subpackages (engine/) too
        name = ".".join(file.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        importlib.import_module(name)
        modules.append(name)
print(len(modules))
"""


def test_serving_code_needs_none_of_the_test_or_bench_packages(tmp_path):
    """`make serve` installs the project without its dev and bench extras: no module of the
    server may import what only they bring (each is refused here, as if absent)."""
    blocked = _not_for_serving()
    assert {"pytest", "openai", "selenium", "hypothesis", "jiwer"} <= set(blocked), blocked  # the dev extra: installed for tests
    done = subprocess.run([sys.executable, "-c", SERVING_IMPORTS, ",".join(blocked), str(ROOT)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) == sum(1 for top in ("asr_service", "adapters") for _ in (ROOT / top).rglob("*.py"))

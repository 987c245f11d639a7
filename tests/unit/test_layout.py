"""The project's layout rules that a reader relies on: the top-level packages import each other
in one direction only (adapters are a leaf the service builds on, never the other way round)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("asr_service", "adapters")


def _imported_packages(package: str) -> dict[str, set[str]]:
    """Which of the project's other top-level packages each module of ``package`` imports
    (absolute imports only: a relative import stays inside its own package)."""
    found: dict[str, set[str]] = {}
    for file in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in PACKAGES and top != package:
                    found.setdefault(top, set()).add(str(file.relative_to(ROOT)))
    return found


def test_adapters_import_nothing_from_the_service_they_serve():
    assert _imported_packages("adapters") == {}


def test_the_service_builds_on_the_adapters():
    # The direction the rule above keeps: the service imports the adapters (a check that the
    # scan sees imports at all, so the test above cannot pass by reading nothing).
    assert "adapters" in _imported_packages("asr_service")

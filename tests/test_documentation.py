"""Docstrings say what and why in a few lines, and the README stays a user guide: measurements and history
live in docs/ and in the commits."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.glob("mnar_recsys/**/*.py"), *ROOT.glob("baselines/*.py")])
MOST_LINES = 15  # of a function's or class's docstring; a module's overview may run longer


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_function_or_class_docstring_runs_past_fifteen_lines(path):
    long = [f"{node.name} (line {node.lineno}): {len(ast.get_docstring(node, clean=False).splitlines())} lines"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and ast.get_docstring(node, clean=False)
            and len(ast.get_docstring(node, clean=False).splitlines()) > MOST_LINES]
    assert not long, f"{path.relative_to(ROOT)}: " + "; ".join(long)


def test_the_readme_is_a_guide_of_at_most_250_lines_without_commit_hashes():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.findall(r"\b[0-9a-f]{7,40}\b", text)

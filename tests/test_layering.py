"""Every import points down the data's way, and no package reaches into another's private modules.

Layers, lowest first: shared checks and devices; data; models; training; inference; evaluation; the
baselines; estimators; pipelines; the command line. A module may import its own layer or one below.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the package root holds only its version, so it sits with the shared modules at the bottom
LAYERS = (
    ("mnar_recsys", "mnar_recsys.checks", "mnar_recsys.devices", "mnar_recsys.allocator", "mnar_recsys.denormals",
     "mnar_recsys.io"),
    ("mnar_recsys.data",),
    ("mnar_recsys.models",),
    ("mnar_recsys.training",),
    ("mnar_recsys.inference",),
    ("mnar_recsys.evaluation",),
    ("baselines",),
    ("mnar_recsys.estimators",),
    ("mnar_recsys.pipelines",),
    ("mnar_recsys.cli",),
)


def layer(module: str) -> int:
    """The layer of a module: that of the longest prefix that names one."""
    matches = [(len(prefix), rank) for rank, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    if not matches:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of this project's packages in the file, top level or not."""
    found = []
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((node.lineno, base))
    return [(line, name) for line, name in found if name.split(".")[0] in ("mnar_recsys", "baselines")]


SOURCES = sorted([*ROOT.glob("mnar_recsys/**/*.py"), *ROOT.glob("baselines/*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: str(path.relative_to(ROOT)))
def test_imports_point_down_and_stay_out_of_other_packages_private_modules(path):
    here = module_name(path)
    wrong = []
    for line, target in imports(path):
        if layer(target) > layer(here):
            wrong.append(f"line {line}: {target} (layer {layer(target)}) from layer {layer(here)}")
        private = [part for part in target.split(".") if part.startswith("_") and part != "__init__"]
        if private and target.split(".")[0] != here.split(".")[0]:
            wrong.append(f"line {line}: {target} is private to {target.split('.')[0]}")
    assert not wrong, f"{here}: " + "; ".join(wrong)

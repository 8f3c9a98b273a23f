"""The package layout's rules, checked on the source tree: imports point one way, modules stay small,
no private name crosses a module boundary, and the product never reaches into the lab."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("predictor", "tuner")
MAX_MODULE_LINES = 800
# Layers of predictor, lowest first: a module may import its own layer and lower ones (longest prefix wins).
# The simulator's engine sits low because it needs only the graph; kernel models price graph tasks, the
# sources emit tasks in their vocabulary; calibration times kernels on synthesised and simulated steps;
# Centimani's decoupled model places tensors with the memory model before it times them.
LAYERS = [
    "predictor.files", "predictor.metrics",
    "predictor.graph",
    "predictor.simulate.engine", "predictor.simulate",
    "predictor.timing.platforms",
    "predictor.timing.kernels",
    "predictor.sources",
    "predictor.simulate.replay",
    "predictor.memory",
    "predictor.sources.synth.decoupled",
    "predictor.timing.calibration", "predictor.timing.calibrate", "predictor.timing",
    "predictor.whatif",
    "predictor.stage",
]


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def _layer(module: str) -> int | None:
    """Index in LAYERS of the longest prefix of ``module`` (None outside the layered packages)."""
    best = None
    for i, prefix in enumerate(LAYERS):
        if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(LAYERS[best])):
            best = i
    return best


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_rules(path: Path) -> None:
    rel = path.relative_to(ROOT)
    n_lines = len(path.read_text(encoding="utf-8").splitlines())
    assert n_lines <= MAX_MODULE_LINES, f"{rel}: {n_lines} lines (split it)"
    me = ".".join(rel.with_suffix("").parts)
    my_layer = _layer(me.removesuffix(".__init__"))
    for module, names in _imports(path):
        root = module.split(".")[0]
        assert root not in ("experiments", "benchmarks"), f"{rel} imports the lab: {module}"
        if me.startswith("predictor"):
            assert root != "tuner", f"{rel} imports {module}: predictor never imports tuner"
            other = _layer(module)
            if my_layer is not None and other is not None:
                assert other <= my_layer, f"{rel} ({LAYERS[my_layer]}) imports {module} ({LAYERS[other]}), a higher layer"
        if root in PACKAGES and module != me:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{rel} imports private names {private} from {module}"
            hidden = [p for p in module.split(".") if p.startswith("_") and not p.startswith("__")]
            assert not hidden or module.rsplit(".", 1)[0] == me.rsplit(".", 1)[0], \
                f"{rel} imports the private module {module} from another package"


def test_tests_use_public_names() -> None:
    """Tests import what the product makes public, as other modules do."""
    for path in sorted((ROOT / "tests").glob("*.py")):
        for module, names in _imports(path):
            if module.split(".")[0] in PACKAGES:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                assert not private, f"{path.name} imports private names {private} from {module}"


@pytest.mark.parametrize("folder", ["experiments", "benchmarks"])
def test_lab_scripts_stay_small(folder: str) -> None:
    big = [f"{p.relative_to(ROOT)}: {n}" for p in sorted((ROOT / folder).glob("*.py"))
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not big, f"scripts over {MAX_MODULE_LINES} lines: {big}"


def test_tests_do_not_import_the_lab() -> None:
    hits = [f"{p.name}: {m}" for p in sorted((ROOT / "tests").glob("*.py")) for m, _ in _imports(p)
            if m.split(".")[0] in ("experiments", "benchmarks")]
    assert not hits, f"tests import experiments/ or benchmarks/: {hits}"


HISTORY_WORDS = re.compile(r"\b(sessions?|spells?)\b", re.IGNORECASE)


def test_no_lab_notebook_words_in_the_product() -> None:
    paths = [*_modules(), ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "search_spaces").glob("*")]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in paths if p.is_file()
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HISTORY_WORDS.search(line)]
    assert not hits, f"development-history words in the product: {hits[:20]}"

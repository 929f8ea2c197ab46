"""The package's modules form layers: none imports a module of a higher layer, and no two import
each other (imports inside functions included; the package root, a facade, is left out)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent / "python" / "tvm_dsm"

#: Lowest first. A module may import from its own layer and the ones before it.
LAYERS = (
    {"errors", "ir", "hardware", "script_parsing", "annotations", "device", "compile_options", "compile_cache", "calibration",
     "step_graphs", "stock"},
    {"schedule"},
    {"intrin"},
    {"fusion"},
    {"workloads"},
    {"transform"},
    {"pipeline"},
    {"tuning_database", "local_measure"},
    {"rules", "kernels"},
    {"planners"},
    {"families"},
    {"driver", "learned_ranking"},
    {"relax_grouping"},
    {"meta_schedule", "relax_attention", "relax_attention_masks", "relax_attention_padding", "relax_constants", "relax_chains", "relax_fills", "relax_gated", "relax_matmuls", "relax_packed_attention", "relax_patches", "relax_patterns", "relax_precision", "relax_reshapes", "relax_siblings", "relax_top_k", "relax_torch", "relax_integration", "relax_weights",
     "relax_pipeline", "model_report"},
    {"bench", "gpu", "cli", "__main__"},
)


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The tvm_dsm modules ``path`` imports (a name imported from a package counts as its
    submodule when one of that name exists)."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                sub_path = ROOT.parent / sub.replace(".", "/")
                found.add(sub if sub_path.with_suffix(".py").exists() or sub_path.is_dir() else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("tvm_dsm.")}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in ROOT.rglob("*.py")}


def _layer(module: str) -> int:
    top = module.split(".")[1]
    return next(i for i, names in enumerate(LAYERS) if top in names)


def test_every_module_has_a_layer():
    assert all(_layer(m) is not None for m in _graph() if m != "tvm_dsm")


def test_no_upward_imports():
    upward = sorted(f"{a} -> {b}" for a, targets in _graph().items() if a != "tvm_dsm"
                    for b in targets if _layer(b) > _layer(a))
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph = _graph()
    graph.pop("tvm_dsm")
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt in graph and nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)

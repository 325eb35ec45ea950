"""The house's layering, checked from the code's own imports (docs/architecture.md): no import
circle between the project's modules; inside `cts/eval/`, a module imports only from its own
package or a lower layer, the layer-3 packages not from one another; no private name is
imported from another `eval` module; the foundation (`cts.foundation`) stands on nothing else of
`cts`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: eval's sub-packages by layer; a module directly under cts/eval/ is layer 4.
EVAL_LAYERS = {
    "data": 0, "score": 1, "run": 2,
    "report": 3, "audit": 3, "viewer": 3, "construct": 3, "interop": 3,
}  # fmt: skip
EVAL = "cts.eval."
FOUNDATION = "cts.foundation"


def _modules() -> dict[str, Path]:
    """Every module the distribution installs: all of them under `cts`."""
    found = {}
    for path in sorted((ROOT / "cts").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(imported module, name) for every import of a project module, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((a.name, "") for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module in modules and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full, "") if full in modules else (node.module, alias.name)


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: {target for target, _ in _imports(path, modules) if target != name}
        for name, path in modules.items()
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def _eval_package(module: str) -> tuple[str, int]:
    parts = module.removeprefix(EVAL).split(".")
    if len(parts) > 1 or parts[0] in EVAL_LAYERS:
        return parts[0], EVAL_LAYERS[parts[0]]
    return "eval", 4


def test_no_module_imports_itself_back_through_others():
    assert _circles(_graph()) == []


def test_eval_imports_only_down_its_layers_and_not_across_layer_three():
    wrong = []
    for module, targets in _graph().items():
        if not module.startswith(EVAL):
            continue
        package, layer = _eval_package(module)
        for target in (t for t in targets if t.startswith(EVAL)):
            other, other_layer = _eval_package(target)
            if other != package and other_layer >= layer:
                wrong.append(f"{module} (layer {layer}) -> {target} (layer {other_layer})")
    assert wrong == []


def test_no_eval_module_imports_a_private_name_of_another():
    modules = _modules()
    private = [
        f"{name} imports {target}.{imported}"
        for name, path in modules.items()
        if name.startswith(EVAL)
        for target, imported in _imports(path, modules)
        if imported.startswith("_")
    ]
    assert private == []


def test_the_foundation_imports_nothing_else_of_the_project():
    """Every part reads configs and writes files through it: one import back up would tie
    them all to what it imported."""
    above = [
        f"{module} -> {target}"
        for module, targets in _graph().items()
        if module.startswith(FOUNDATION)
        for target in targets
        if not target.startswith(FOUNDATION)
    ]
    assert above == []
    assert f"{FOUNDATION}.yaml_config" in _graph()[f"{FOUNDATION}.secrets"]  # the check sees


def test_the_checks_see_a_circle_and_an_upward_import():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _eval_package("cts.eval.data.schema") == ("data", 0)
    assert _eval_package("cts.eval.experiment") == ("eval", 4)
    assert _eval_package("cts.eval.construct.fuse") == ("construct", 3)


def test_the_checks_see_every_installed_module():
    """A check over no module passes whatever the code does: the house is all under `cts`."""
    modules = _modules()
    assert "cts.eval.run.pipeline" in modules and "cts.cli.app" in modules
    assert sum(name.startswith(EVAL) for name in modules) > 50

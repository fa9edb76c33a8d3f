"""The library's shape: no import cycles, nothing imports upward, small modules and
functions, and the CPU-only package stays unimported off the CPU.

Every import is read from the source with `ast` (module level and inside functions
alike), relative imports resolved, `from package import name` taken as an import of
the submodule `name` where there is one (else of the package, or of the module the
package's lazy `_EXPORTS` names).
"""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (folder, the dotted name it is installed as)
SOURCES = ((ROOT / "dflash_mlx", "dflash_mlx"), (ROOT / "cli", "dflash_mlx.cli"))

# Lowest first: a module may import its own layer and the layers before it.
LAYERS = (
    (
        "dflash_mlx",
        "dflash_mlx.validate",
        "dflash_mlx.heap",
        "dflash_mlx.files",
        "dflash_mlx.sampling",
        "dflash_mlx.kernels",
        "dflash_mlx.distributed",
        "dflash_mlx.conversation",
        "dflash_mlx.datasets",
        "dflash_mlx.install",
        "dflash_mlx.structured",
    ),
    ("dflash_mlx.cpu",),
    ("dflash_mlx.backend",),
    ("dflash_mlx.models",),
    ("dflash_mlx.engine",),
    ("dflash_mlx.loading", "dflash_mlx.gguf"),
    ("dflash_mlx.generate",),
    ("dflash_mlx.chat", "dflash_mlx.bench", "dflash_mlx.serve", "dflash_mlx.train"),
    ("dflash_mlx.cli",),
)
MAX_MODULE_LINES = 400
MAX_BODY_LINES = 60  # a function's statements, its docstring not counted


def _modules() -> dict[str, Path]:
    """Every module's dotted name -> its file."""
    found = {}
    for folder, name in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


MODULES = _modules()


def _lazy_exports(path: Path) -> dict[str, str]:
    """A package's `_EXPORTS = {name: (module, attribute)}`, as name -> module."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            exports = ast.literal_eval(node.value)
            return {k: v[0] for k, v in exports.items()}
    return {}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, path: Path, node: ast.ImportFrom) -> set[str]:
    """The library modules one `from ... import ...` statement imports."""
    source = _resolve(module, path, node)
    if source not in MODULES:
        return set()
    found = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in MODULES:
            found.add(sub)
            continue
        lazy = _lazy_exports(MODULES[source]).get(alias.name)
        found.add(f"{source}.{lazy}" if lazy else source)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the library modules it imports (anywhere in its source)."""
    graph = {}
    for module, path in MODULES.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in MODULES}
            elif isinstance(node, ast.ImportFrom):
                edges |= _targets(module, path, node)
        graph[module] = edges - {module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [])):
            return cycle
    return None


def layer(module: str) -> int:
    """The index in LAYERS of the longest prefix naming `module`'s layer."""
    best = None
    for i, names in enumerate(LAYERS):
        for name in names:
            inside = name != "dflash_mlx" and module.startswith(name + ".")
            if module == name or inside:
                if best is None or len(name) > len(best[1]):
                    best = (i, name)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "dflash_mlx.models.target" in graph["dflash_mlx.loading.drafters"]
    # inside a function, relative, from the package's lazy exports
    assert "dflash_mlx.cpu" in graph["dflash_mlx.backend"]
    assert "dflash_mlx.loading.targets" in graph["dflash_mlx.cli.bench"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_a_higher_layer():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_every_package_says_what_it_is_for():
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            assert ast.get_docstring(ast.parse(path.read_text())), module


def test_modules_stay_small():
    long = {
        m: n
        for m, p in MODULES.items()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def _body_lines(node) -> int:
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]  # the docstring
    return node.end_lineno - body[0].lineno + 1


def test_functions_stay_short():
    long = [
        f"{module}.{node.name}: {lines}"
        for module, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (lines := _body_lines(node)) > MAX_BODY_LINES
    ]
    assert not long, f"functions over {MAX_BODY_LINES} lines of body: {long}"


CPU_UNTOUCHED = """
import sys
import mlx.core as mx
from dflash_mlx import backend, kernels
assert backend.for_device(mx.gpu) is kernels.MLX
loaded = sorted(m for m in sys.modules if m.split(".")[:2] == ["dflash_mlx", "cpu"])
assert not loaded, loaded
"""


def test_other_devices_never_import_the_cpu_package():
    """Off the CPU (a Mac's GPU), the kernels are MLX's and `dflash_mlx.cpu` is never
    imported (a fresh interpreter: this one has imported everything)."""
    done = subprocess.run(
        [sys.executable, "-c", CPU_UNTOUCHED],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

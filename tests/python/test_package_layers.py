"""The Python package's floors, checked from its source: every import of a
weightlift module (at module level or inside a function) goes to a module of
the same floor or a lower one, never up, and no two modules import each other
round a circle. LAYERS below is the one place the floors are written down
(docs/python.md, "Extending it", explains them). And one bridge: _engine is
the module that calls the extension (_core) for loads; besides it only the
families with bindings of their own do (CORE_CALLERS, at most 5).

The check parses the files with `ast`; nothing is imported or run."""
from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "python" / "weightlift"

# Ground first. A name here is a module ("_engine"), the package itself
# ("__init__"), or a subpackage, which covers its modules ("safetensors"
# covers weightlift.safetensors.*) unless one of them is listed on its own.
LAYERS: list[tuple[str, set[str]]] = [
    # the extension, the logger, engine bytes -> torch
    ("ground", {"_core", "_log", "_tensors"}),
    # the bridge: options and plans, the stream, the one conversion loop, the progress bar,
    # and the engine's files, facts and rules for every module above
    ("bridge", {"_engine"}),
    # small single-purpose modules: locks and files, prefetch, parameters, rules over names
    ("leaves", {"_files", "_prefetch", "_params", "ep_weight_filter", "_vllm_extras", "_text"}),
    # one module per source, destination or API family
    ("features", {"_distributed", "_gpu", "_hub", "_objstore", "_configs", "_st", "_st_prefetch", "safetensors",
                  "load_into"}),
    # the public namespaces: they only import downward
    ("facades", {"weight_utils", "vllm_compat", "__init__"}),
    # plug-ins into other programs, standing on the public namespaces
    ("plugins", {"vllm_plugin"}),
]


def floor_of(module: str, layers=LAYERS) -> int | None:
    """The index in `layers` of a dotted name relative to the package ("" is
    the package itself); None when no entry covers it."""
    name = module or "__init__"
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        for i, (_, members) in enumerate(layers):
            if prefix in members:
                return i
    return None


def modules_of(root: pathlib.Path, extensions=("_core",)) -> dict[str, pathlib.Path | None]:
    """Dotted names relative to the package ("" = its __init__) -> file."""
    found: dict[str, pathlib.Path | None] = {e: None for e in extensions}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        if rel[-1] == "__init__":
            rel = rel[:-1]
        found[".".join(rel)] = path
    return found


def imports_of(module: str, path: pathlib.Path, known: set[str], package: str):
    """(target module, imported name or None, line) for every import of a
    package module in `path`, wherever it stands (module level, function,
    class, try block)."""
    is_pkg = path.name == "__init__.py"
    here = module.split(".") if module else []
    pkg = here if is_pkg else here[:-1]
    out = []

    def add(target_parts, name, line):
        target = ".".join(target_parts)
        if name is not None and ".".join(target_parts + [name]) in known:
            out.append((".".join(target_parts + [name]), None, line))  # a submodule
        elif target in known:
            out.append((target, name, line))

    def from_parts(node: ast.ImportFrom) -> list[str] | None:
        if node.level:
            if node.level - 1 > len(pkg):
                return None
            base, rest = pkg[: len(pkg) - node.level + 1], node.module or ""
        elif node.module and (node.module == package or node.module.startswith(package + ".")):
            base, rest = [], node.module[len(package) + 1:]
        else:
            return None
        return base + (rest.split(".") if rest else [])

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            parts = from_parts(node)
            if parts is not None:
                for alias in node.names:
                    add(parts, alias.name, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    rel = alias.name[len(package) + 1:]
                    add(rel.split(".") if rel else [], None, node.lineno)
    return out


def check(root: pathlib.Path, layers=LAYERS, package: str = "weightlift") -> list[str]:
    """Every broken rule, one line each: a module on no floor, an import that
    goes up (naming a private name it takes), an import circle."""
    mods = modules_of(root)
    known = set(mods)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    label = lambda m: package + ("." + m if m else "")  # noqa: E731
    for m in sorted(mods):
        if floor_of(m, layers) is None:
            problems.append(f"{label(m)} is on no floor: add it to LAYERS in tests/python/test_package_layers.py")
    for m, path in sorted(mods.items(), key=lambda kv: kv[0]):
        if path is None:
            continue
        mine = floor_of(m, layers)
        upward: dict[tuple[int, str], list[str]] = {}  # (line, target) -> the private names taken
        for target, name, line in imports_of(m, path, known, package):
            if target == m:
                continue
            graph[m].add(target)
            theirs = floor_of(target, layers)
            if mine is not None and theirs is not None and theirs > mine:
                upward.setdefault((line, target), []).extend([name] if name and name.startswith("_") else [])
        for (line, target), private in sorted(upward.items()):
            theirs = floor_of(target, layers)
            taken = f", taking the private name(s) {', '.join(private)}" if private else ""
            problems.append(f"{path.relative_to(root.parent)}:{line}: {label(m)} ({layers[mine][0]}) imports "
                            f"{label(target)} ({layers[theirs][0]}), a higher floor{taken}")
    for cycle in cycles(graph):
        problems.append("import circle: " + " -> ".join(label(m) for m in cycle + [cycle[0]]))
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(path_round(graph, sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def path_round(graph, comp: list[str]) -> list[str]:
    """A circle through comp[0] inside the component (breadth first)."""
    inside, start = set(comp), comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return path[::-1]
            if w in inside and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


# The modules that may call the extension: the bridge, and the families with
# bindings of their own (the Hub, collectives, devices, quantization configs).
# Nothing else imports _core: weightlift.safetensors (_st) and _text read through _engine.
CORE_CALLERS = {"_engine", "_hub", "_distributed", "_gpu", "_configs"}
MAX_CORE_CALLERS_BESIDES_THE_BRIDGE = 5


def core_callers(root: pathlib.Path, package: str = "weightlift") -> set[str]:
    """The modules whose source imports _core (in any form, anywhere)."""
    mods = modules_of(root)
    known = set(mods)
    return {m for m, path in mods.items() if path is not None and m != "_core"
            and any(target == "_core" for target, _, _ in imports_of(m, path, known, package))}


# ---- the package ----------------------------------------------------------------------------------


def test_the_package_imports_only_downward_and_round_no_circle():
    assert PACKAGE.is_dir(), PACKAGE
    problems = check(PACKAGE)
    assert not problems, "\n".join(problems)


def test_one_bridge_to_the_extension():
    callers = core_callers(PACKAGE)
    assert "_engine" in callers
    stray = sorted(callers - CORE_CALLERS)
    assert not stray, f"modules calling _core besides the bridge's families: {stray} (add a function to _engine.py)"
    assert len(callers - {"_engine"}) <= MAX_CORE_CALLERS_BESIDES_THE_BRIDGE, sorted(callers)


def test_the_bridge_check_finds_a_caller(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from ._core import x\n    return x\n",
        "mid.py": "from . import low\n",
        "top.py": "import pkg._core as c\n",
    })
    assert core_callers(pkg, "pkg") == {"low", "top"}


def test_every_floor_is_named_once():
    seen: dict[str, str] = {}
    for floor, members in LAYERS:
        for m in members:
            assert m not in seen, f"{m} is on two floors: {seen[m]} and {floor}"
            seen[m] = floor


# ---- the check itself fails where it should ---------------------------------------------------------


def _package(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    pkg = root / "pkg"
    for name, text in files.items():
        p = pkg / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return pkg


LAYERS_FOR_TESTS = [("ground", {"_core", "low", "sub"}), ("middle", {"mid"}), ("facades", {"__init__", "top"})]


def test_the_check_finds_an_upward_private_import_inside_a_function(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from .top import api\n",
        "top.py": "from . import low\n_helper = 1\ndef api():\n    return low.f()\n",
        "low.py": "def f():\n    from .top import _helper\n    return _helper\n",
        "mid.py": "from . import _core, low\n",
    })
    problems = check(pkg, LAYERS_FOR_TESTS, "pkg")
    assert any("pkg.low (ground) imports pkg.top (facades), a higher floor, taking the private name(s) _helper" in p
               for p in problems), problems
    assert any(p.startswith("import circle: pkg.low -> pkg.top -> pkg.low") for p in problems), problems
    assert not any("pkg.mid" in p for p in problems), problems


def test_the_check_finds_absolute_imports_subpackages_and_unplaced_modules(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "top.py": "X = 1\n",
        "mid.py": "import pkg.top\n",
        "sub/__init__.py": "from .inner import g\n",
        "sub/inner.py": "from .. import mid\ndef g():\n    from pkg import top\n",
        "stray.py": "",
    })
    problems = check(pkg, LAYERS_FOR_TESTS, "pkg")
    assert any("pkg.mid (middle) imports pkg.top (facades)" in p for p in problems), problems
    assert any("pkg.sub.inner (ground) imports pkg.mid (middle)" in p for p in problems), problems
    assert any("pkg.sub.inner (ground) imports pkg.top (facades)" in p for p in problems), problems
    assert any(p.startswith("pkg.stray is on no floor") for p in problems), problems
    assert not any("circle" in p for p in problems), problems


@pytest.mark.parametrize("module,floor", [("_engine", "bridge"), ("", "facades"), ("weight_utils", "facades"),
                                          ("_core", "ground")])
def test_floor_of(module, floor):
    assert LAYERS[floor_of(module)][0] == floor

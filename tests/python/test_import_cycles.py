"""No module of bindings/python/dsopt imports, directly or through others,
a module that imports it back: every import statement counts, at module
level or inside a function. A package's ``__init__`` is a module like the
others (``from . import name`` of a name that is not a submodule imports
it); the parents Python imports before a submodule are not counted."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "bindings" / "python" / "dsopt"


def module_files(root):
    """{dotted module name: path} of every .py file under package ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported(name, path, modules):
    """The modules of ``modules`` that module ``name`` (file ``path``) imports."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    return sorted(m for m in found if m in modules and m != name)


def import_graph(root):
    modules = module_files(root)
    return {name: imported(name, path, modules) for name, path in modules.items()}


def cycles(graph):
    """The cycles a depth-first search meets (each a list of modules, the
    first repeated at the end): at least one through each group of modules
    that import each other; [] when there is none."""
    found, done = [], set()

    def visit(node, path, on_path):
        on_path[node] = len(path)
        path.append(node)
        for nxt in graph[node]:
            if nxt in on_path:
                found.append(path[on_path[nxt]:] + [nxt])
            elif nxt not in done:
                visit(nxt, path, on_path)
        path.pop()
        del on_path[node]
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            visit(node, [], {})
    return found


def test_the_dsopt_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert "dsopt.torch._optimizer" in graph and "dsopt.plan.planner" in graph
    assert "dsopt.torch._classes" in graph["dsopt.torch"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = tmp_path / "pkg"
    write(root, "__init__.py", "from .a import f\n")
    write(root, "a.py", "from . import b\n\ndef f():\n    return b.g()\n")
    write(root, "b.py", "def g():\n    from .a import f\n    return f\n")
    write(root, "c.py", "import pkg.b\n")
    graph = import_graph(root)
    assert graph == {"pkg": ["pkg.a"], "pkg.a": ["pkg.b"], "pkg.b": ["pkg.a"],
                     "pkg.c": ["pkg.b"]}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    root = tmp_path / "pkg"
    write(root, "__init__.py", "from .sub import thing, helper\n")
    write(root, "sub/__init__.py", "from .x import thing\nfrom .y import helper\n")
    write(root, "sub/x.py", "thing = 1\n")
    write(root, "sub/y.py", "def helper():\n    from .. import sub\n    from . import thing\n")
    graph = import_graph(root)
    assert graph["pkg.sub.y"] == ["pkg.sub"]
    assert cycles(graph) == [["pkg.sub", "pkg.sub.y", "pkg.sub"]]
    write(root, "sub/y.py", "def helper():\n    from .x import thing\n")
    assert cycles(import_graph(root)) == []

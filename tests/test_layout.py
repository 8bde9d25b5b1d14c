"""The directions of the imports (docs/development.md, "Where things are"),
read from the source with `ast`: each third-party library enters through one place, the math
imports nothing heavy, each place imports only the places below it in the table, no specgen
module imports one that imports it back, only the sink writes to the terminal, no
function in cli/ is longer than a screen, and no module longer than 500 lines."""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specgen"

#: the math, the protocols and file plumbing: numpy, the standard library and each other only
PURE = frozenset(
    f"specgen.{m}"
    for m in (
        "sampling",
        "constraints",
        "rejection",
        "logprobs",
        "cutoff",
        "control",
        "control.acceptance",
        "control.costs",
        "control.goodput",
        "control.latency",
        "control.batch",
        "measure",
        "acceptance_stats",
        "errors",
        "engine",
        "events",
        "fileio",
    )
)

#: third-party library -> where it may be imported (a module, or a package and all under it)
ONE_DOOR = {
    "rich": "specgen.ui",
    "typer": "specgen.cli",
    "click": "specgen.cli",
    "llama_cpp": "specgen.llamacpp",
    "huggingface_hub": "specgen.models.hub",
    "httpx2": "specgen.models.hub",  # huggingface_hub's HTTP client (its get_session())
    "yaml": "specgen.models.registry",
    "gguf": "specgen.models.gguf",
    "matplotlib": "specgen.bench",  # the plots of bench's two reports
    # the server's libraries (the only place FastAPI, uvicorn and pydantic enter)
    "fastapi": "specgen.server",
    "starlette": "specgen.server",
    "sse_starlette": "specgen.server",
    "uvicorn": "specgen.server",
    "pydantic": "specgen.server",
    "prometheus_client": "specgen.server",
    "openai": "specgen.bench.load",  # the load client for servers
    "httpx": "specgen.bench.load",  # the load client of `bench --url`
    "httpcore": "specgen.bench.load",  # httpx's core, which that client drives directly
    "uvloop": "specgen.eventloop",
    "llguidance": "specgen.grammar",  # grammars, JSON schemas, masks  # the event loop of the server and the load client
}

#: the layout as ranks: a place imports (outside `if TYPE_CHECKING:`) only places of
#: its own rank or below. Names are relative to `specgen`; a package covers all under it.
RANKS: tuple[tuple[str, ...], ...] = (
    ("errors", "fileio", "eventloop", "deepstack"),
    # the math, the protocols and the typed flags (flags.params() reaches sampling lazily)
    # and llama.cpp's vocabulary rules (compat: models/local.py groups files by them)
    (
        "sampling",
        "constraints",
        "rejection",
        "logprobs",
        "cutoff",
        "control",
        "measure",
        "acceptance_stats",
        "engine",
        "events",
        "logitbias",  # -l and logit_bias read into pairs, for the flags
        "flags",
        "genconfig",  # a generation's settings, built from the flags
        "compat",
        "grammarspec",  # what a grammar is before compilation (no llguidance)
    ),
    # the doors: llama.cpp, files/registry/Hub, and llguidance (grammars)
    ("llamacpp", "models", "grammar"),
    ("drafters", "hybrid", "ngram", "emit", "grammarrows"),
    # the round unit, the batch engine over slots, and what drives them
    ("round", "proposal", "stages", "sched", "generate", "chat"),
    ("session",),  # the one loader
    # the public API (its arguments, engines and results in apiargs, apiengine and generation)
    # and what uses the loop
    ("api", "apiargs", "apiengine", "generation", "bench", "verify", "trace", "server"),
    ("ui",),
    ("cli", "__main__"),
)

#: pairs of the same rank that must not import each other (both directions listed)
APART = (("llamacpp", "models"), ("models", "llamacpp"))

#: breaks of the table tolerated until their owner removes them: (module, imported, why)
KNOWN_BREAKS: dict[tuple[str, str], str] = {}


def rank_of(module: str) -> int | None:
    if module == "specgen":
        return rank_of("specgen.api")  # specgen/__init__.py: the public API
    rest = module.removeprefix("specgen.")
    for r, places in enumerate(RANKS):
        if any(rest == p or rest.startswith(p + ".") for p in places):
            return r
    return None


@dataclass(frozen=True)
class Import:
    module: str  # the importing specgen module
    target: str  # the imported module, as written (absolute)
    line: int
    top_level: bool  # executed when the module is imported (not in a function)
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path) -> list[Import]:
    """Every import statement of `module`, with the module each one loads."""
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(module, alias.name, node.lineno, top_level, type_only))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                # `from specgen import bench` loads the module specgen.bench
                sub = f"{base}.{alias.name}"
                target = sub if sub in MODULES else base
                found.append(Import(module, target, node.lineno, top_level, type_only))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, top_level, True)
            for child in node.orelse:
                visit(child, top_level, type_only)
        else:
            in_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            for child in ast.iter_child_nodes(node):
                visit(child, top_level and not in_function, type_only)

    visit(ast.parse(path.read_text("utf-8"), str(path)), True, False)
    return found


@functools.cache
def all_imports() -> list[Import]:
    """Every import of every specgen module: parsed on first use, not at collection (each
    pytest-xdist worker collects this file; only the one that runs these tests parses)."""
    return [imp for name, path in MODULES.items() for imp in imports_of(name, path)]


def _within(module: str, place: str) -> bool:
    return module == place or module.startswith(place + ".")


def _where(imp: Import) -> str:
    return f"{MODULES[imp.module].relative_to(ROOT)}:{imp.line} imports {imp.target}"


@pytest.mark.parametrize("library", sorted(ONE_DOOR))
def test_each_library_enters_through_one_place(library: str) -> None:
    place = ONE_DOOR[library]
    bad = sorted(
        {
            _where(i)
            for i in all_imports()
            if _within(i.target, library) and not i.type_only and not _within(i.module, place)
        }
    )
    assert not bad, f"{library} only in {place}:\n" + "\n".join(bad)


def test_the_math_imports_only_numpy_the_standard_library_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy"}
    bad = [
        _where(i)
        for i in all_imports()
        if i.module in PURE
        and not (i.target.split(".")[0] in allowed or i.target in PURE)
        and not i.type_only
    ]
    assert not bad, "\n".join(bad)


def test_every_module_has_a_place_in_the_table() -> None:
    assert [m for m in MODULES if rank_of(m) is None] == []


def _row_breaks(imports: list[Import]) -> list[tuple[str, str]]:
    bad = []
    for i in imports:
        if i.type_only or i.target not in MODULES or i.target == i.module:
            continue
        mine, theirs = rank_of(i.module), rank_of(i.target)
        apart = any(
            _within(i.module, f"specgen.{a}") and _within(i.target, f"specgen.{b}")
            for a, b in APART
        )
        if mine is not None and theirs is not None and (theirs > mine or apart):
            bad.append((i.module, i.target))
    return bad


def test_each_place_imports_only_the_places_below_it() -> None:
    bad = sorted({b for b in _row_breaks(all_imports()) if b not in KNOWN_BREAKS})
    assert not bad, "imports against the ranks (docs/development.md):\n" + "\n".join(
        f"{m} -> {t}" for m, t in bad
    )


def test_the_table_check_finds_an_upward_import() -> None:
    up = Import("specgen.sampling", "specgen.session", 1, True, False)
    down = Import("specgen.session", "specgen.sampling", 1, True, False)
    door = Import("specgen.models.resolve", "specgen.llamacpp", 1, False, False)
    typed = Import("specgen.bench.method", "specgen.cli.run", 1, True, True)
    assert _row_breaks([up, down, door, typed]) == [
        ("specgen.sampling", "specgen.session"),
        ("specgen.models.resolve", "specgen.llamacpp"),
    ]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for i in all_imports():
        if i.target in MODULES and not i.type_only and (i.top_level or not top_level_only):
            if i.target != i.module:
                edges.setdefault(i.module, set()).add(i.target)
    return edges


def test_no_module_level_import_cycle() -> None:
    assert _cycles(_graph(top_level_only=True)) == []


#: cycles closed only by a function-local import, tolerated until their owner removes them
KNOWN_LOCAL_CYCLES: list[list[str]] = []


def test_no_import_cycle_through_function_local_imports() -> None:
    cycles = _cycles(_graph(top_level_only=False))
    assert [c for c in cycles if c not in KNOWN_LOCAL_CYCLES] == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_scanner_sees_local_type_only_and_from_imports() -> None:
    found = {
        (i.target, i.top_level, i.type_only)
        for i in imports_of("specgen.cli.run", MODULES["specgen.cli.run"])
    }
    assert ("specgen.cli.options", True, False) in found
    assert ("specgen.session", True, True) in found  # under TYPE_CHECKING
    assert ("specgen.generate", False, False) in found  # inside a function


def test_models_yaml_is_at_the_top_level_and_is_what_the_package_reads() -> None:
    from specgen.models.registry import PACKAGED_FILE

    top = ROOT / "models.yaml"
    assert top.is_file() and not top.is_symlink()
    assert PACKAGED_FILE.resolve() == top
    assert not (PACKAGE / "models.yaml").exists()


def test_every_data_file_of_the_package_is_shipped() -> None:
    """pyproject's package-data names every file of the package that is not Python: the
    wheel had no ``py.typed``, so a user's mypy saw none of the annotations (PEP 561)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["specgen"]
    data = [
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*")
        if p.is_file() and not p.is_symlink() and p.suffix not in (".py", ".pyc")
    ]
    assert Path("py.typed") in data
    assert [p for p in data if not any(p.match(g) for g in globs)] == []


# -- the one output sink ------------------------------------------------------------------------

#: writes only the sink may make: the process's streams, print, Rich consoles, Click's echo,
#: tracebacks printed to stderr
_STREAMS = frozenset({"stdout", "stderr", "__stdout__", "__stderr__"})
_PRINTERS = frozenset({"print_exc", "print_exception", "print_stack", "print_tb"})

#: where a renderable may be printed on a console the sink made (`console.print`): the live
#: view, the progress bars and the sink itself
_UI_PRINTERS = frozenset({"specgen.ui.output", "specgen.ui.live", "specgen.ui.progress"})


#: where a raw write to a file descriptor (os.write) may happen: ggml's abort handler, which
#: runs on ggml's own thread right before abort(), where no Python stream may be used
_RAW_WRITERS = ("specgen.llamacpp",)


def writes_of(module: str, path: Path) -> list[str]:
    """Each place in `module` that writes to stdout or stderr without the sink."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        what = None
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _STREAMS
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            what = f"sys.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and node.module == "sys":
            if {a.name for a in node.names} & _STREAMS:
                what = "from sys import a stream"
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if "write" in {a.name for a in node.names}:
                what = "from os import write"
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in ("print", "echo", "secho", "Console"):
                what = f"{f.id}()"
            elif isinstance(f, ast.Attribute):
                if f.attr in ("echo", "secho", "Console") or f.attr in _PRINTERS:
                    what = f"{f.attr}()"
                elif f.attr == "print" and module not in _UI_PRINTERS:
                    what = ".print()"
                elif (
                    f.attr == "write"
                    and isinstance(f.value, ast.Name)
                    and f.value.id == "os"
                    and not any(_within(module, w) for w in _RAW_WRITERS)
                ):
                    what = "os.write()"
        if what is not None:
            found.append(f"{where}:{node.lineno} {what}")
    return found


def test_only_the_sink_writes_to_stdout_and_stderr() -> None:
    bad = [
        w
        for name, path in MODULES.items()
        if name != "specgen.ui.output"
        for w in writes_of(name, path)
    ]
    assert not bad, "write through specgen.ui.output:\n" + "\n".join(bad)


def test_the_sink_check_finds_each_kind_of_write(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "import sys, traceback, typer\n"
        "from sys import stderr\n"
        "sys.stdout.write('a')\n"
        "print('b')\n"
        "typer.echo('c')\n"
        "Console().print('d')\n"
        "traceback.print_exc()\n"
        "err.print('e')\n"
        "import os\n"
        "from os import write\n"
        "os.write(2, b'f')\n",
        "utf-8",
    )
    kinds = sorted(w.split(" ", 1)[1] for w in writes_of("specgen.cli.x", src))
    assert kinds == sorted(
        [
            "from sys import a stream",
            "sys.stdout",
            "print()",
            "echo()",
            "Console()",
            ".print()",
            "print_exc()",
            ".print()",
            "from os import write",
            "os.write()",
        ]
    )
    # ggml's abort handler may write raw, also once llamacpp is a package
    assert not any("os.write" in w for w in writes_of("specgen.llamacpp.rpc", src))


#: the server's core, which knows nothing of HTTP (docs/development.md)
HTTP_FREE = ("specgen.sched", "specgen.server.stats")
_HTTP = ("fastapi", "starlette", "uvicorn", "sse_starlette", "pydantic", "prometheus_client")


def test_the_scheduler_and_the_stats_import_no_http_library() -> None:
    bad = [
        _where(i)
        for i in all_imports()
        if any(_within(i.module, m) for m in HTTP_FREE)
        and any(_within(i.target, lib) for lib in _HTTP)
    ]
    assert not bad, "\n".join(bad)


#: the longest function body allowed in cli/ (docs/development.md: thin commands), Typer's signature
#: of options aside
CLI_BODY_LINES = 40

#: cli modules exempt from the two cli checks below (none: keep it empty; a module written
#: before a check lands may be listed here until its owner splits it)
KNOWN_LONG_CLI: frozenset[str] = frozenset()


def test_no_cli_function_is_longer_than_a_screen() -> None:
    long = []
    for name, path in MODULES.items():
        if not _within(name, "specgen.cli") or name in KNOWN_LONG_CLI:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.body[-1].end_lineno - node.body[0].lineno + 1  # type: ignore[operator]
                if n > CLI_BODY_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


#: the most lines a module may have: one that reads in one sitting (issue 33's goal)
MODULE_LINES = 500


def test_no_module_is_longer_than_a_sitting() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in MODULES.values()
        if (n := len(path.read_text("utf-8").splitlines())) > MODULE_LINES
    ]
    assert not long, "\n".join(long)


def _unexplained_local_imports(module: str, path: Path) -> list[str]:
    """Function-local imports with no comment on their line or the few lines above
    (the block's first import carries the reason, usually start-up time)."""
    lines = path.read_text("utf-8").splitlines()
    bad = []
    for i in imports_of(module, path):
        if i.top_level or i.type_only:
            continue
        above = lines[max(0, i.line - 4) : i.line]
        if not any("#" in ln for ln in above):
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            bad.append(f"{where}:{i.line} imports {i.target}")
    return bad


def test_each_local_import_in_cli_says_why() -> None:
    bad = [
        b
        for name, path in MODULES.items()
        if _within(name, "specgen.cli") and name not in KNOWN_LONG_CLI
        for b in _unexplained_local_imports(name, path)
    ]
    assert not bad, "say why each import is local (start-up time?):\n" + "\n".join(bad)


def test_the_reason_check_finds_a_bare_local_import(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "def f():\n    import json\n\n\n\n\ndef g():\n    # start-up time\n    import csv\n",
        "utf-8",
    )
    assert _unexplained_local_imports("specgen.cli.x", src) == [f"{src}:2 imports json"]


def _test_module_imports(path: Path) -> list[str]:
    """The modules `path` imports (top-level and inside functions), as written."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_test_file_imports_another() -> None:
    """Issue 33 item 6: helpers shared by test files live in tests/support/ (or a helper
    module beside the tests), never in a test file another one imports."""
    tests = ROOT / "tests"
    bad = [
        f"{path.name} imports {name}"
        for path in sorted(tests.glob("*.py")) + sorted((tests / "support").glob("*.py"))
        for name in _test_module_imports(path)
        if name.split(".")[-1].startswith("test_") or name.startswith(("tests.", "conftest"))
    ]
    assert not bad, bad

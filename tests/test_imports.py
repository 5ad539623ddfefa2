"""The import graph of the package and the repo's tooling: no circles, no arrows up, only the plugin reaches into
the recorder, and the recorder judges nothing.

Built from the source with ``ast`` (nothing is imported). Every ``import`` statement counts, at module level or
inside a function, so a lazy import cannot hide a circle or an arrow up; an import that must go up says so on its
own line, ``# layers: up (the reason)``, and only then is it left out of the arrow check (never out of the circle
check). The layers are docs/architecture.md's ("The layers").
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import spectrace

ROOT = Path(spectrace.__file__).parent
REPO = ROOT.parent
PACKAGES = ("spectrace", "tools", "bench")  # the product and the repo's own tooling (tests/ import anything)

# The layers, lowest first: a module imports modules of its own layer or below. A module's layer is the one of the
# longest prefix naming it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("leaves", ("spectrace", "spectrace.records", "spectrace.bands", "spectrace.settings", "spectrace.console",
                "spectrace.identity", "spectrace.redact", "spectrace.request_ids", "spectrace.arrow_types",
                "spectrace.values", "spectrace.buffer", "spectrace.load_facts", "spectrace.config_dicts",
                "spectrace.readings", "spectrace.sink", "spectrace.files")),
    ("audit", ("spectrace.audit",)),  # pure judgement; audit.rules inside it
    ("vllm_objects", ("spectrace.vllm_objects",)),  # pure readers of vLLM objects (they name the audit's fields)
    ("pipeline", ("spectrace.pipeline",)),  # the flush: buffer, batches, the Sink protocol
    ("store", ("spectrace.store",)),  # a sink's files (the writer is a pipeline Sink)
    ("lake", ("spectrace.lake",)),
    ("sinks", ("spectrace.sinks",)),  # the registry picks the store's and the lake's sinks
    ("recorder", ("spectrace.recorder",)),  # everything that hooks vLLM
    ("collector", ("spectrace.collector",)),  # reads what the recorder ships: drain, pipeline, sinks
    ("plugin", ("spectrace.plugin",)),  # vLLM's entry point: the only importer of the recorder
    ("commands", ("spectrace.queries", "spectrace.dashboards", "spectrace.doctor", "spectrace.probe",
                  "spectrace.top", "spectrace.diff")),  # what the subcommands read and render
    ("testing", ("spectrace.testing",)),  # real-vLLM runners for the tests, the demo and the benchmarks
    ("cli", ("spectrace.demo", "spectrace.cli")),
    ("repo tooling", ("tools", "bench")),
]
UP = re.compile(r"#\s*layers:\s*up\s*\((.+)\)")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _edges(modules: dict[str, Path] | None = None) -> dict[str, dict[str, bool]]:
    """module -> {module it imports: whether every such import is marked ``# layers: up (...)``} (a fresh copy)."""
    if modules is None:
        return {name: dict(targets) for name, targets in _tree_edges().items()}
    return _build(modules)


@functools.lru_cache(maxsize=1)
def _tree_edges() -> dict[str, dict[str, bool]]:
    return _build(_modules())


def _build(modules: dict[str, Path]) -> dict[str, dict[str, bool]]:
    graph: dict[str, dict[str, bool]] = {name: {} for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            marked = any(UP.search(lines[i]) for i in range(node.lineno - 1, node.end_lineno))
            for target in targets:
                # the deepest module the import names (a name imported from a module is that module)
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a module's own packages are imported before it anyway: no edge
                if target and not (name + ".").startswith(target + "."):
                    graph[name][target] = graph[name].get(target, True) and marked
    return graph


def _graph() -> dict[str, set[str]]:
    return {name: set(targets) for name, targets in _edges().items()}


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (its longest prefix); KeyError for a module in none."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            # the package itself is a leaf; its modules are each in the layer that names them
            inside = module.startswith(prefix + ".") and prefix != "spectrace"
            if (module == prefix or inside) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise KeyError(module)
    return best[0]


def arrows_up(edges: dict[str, dict[str, bool]]) -> list[str]:
    """Every import of a module in a higher layer, unmarked: ``"a (layer) -> b (layer)"``."""
    found = []
    for name, targets in sorted(edges.items()):
        for target, marked in sorted(targets.items()):
            if not marked and layer(target) > layer(name):
                found.append(f"{name} ({LAYERS[layer(name)][0]}) -> {target} ({LAYERS[layer(target)][0]})")
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_the_package():
    graph = _graph()
    assert "spectrace.recorder.runtime" in graph["spectrace.recorder.verify.hooks"]
    assert "spectrace.vllm_objects.configs" in graph["spectrace.recorder.runtime"]
    assert "spectrace.audit" in graph["spectrace.doctor.diagnose"]
    assert "spectrace.audit.rules.acceptance" in graph["spectrace.audit.run_judge"]  # imported as a name of a package
    assert "tools.versions_table" in graph["tools.docs_reference"]  # lazy, inside a function


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    graph = _graph()
    graph["spectrace.audit"].add("spectrace.doctor.diagnose")
    assert any({"spectrace.audit", "spectrace.doctor.diagnose"} <= set(c) for c in _cycles(graph))


def test_every_module_has_a_layer():
    assert [m for m in _modules() if not _has_layer(m)] == []


def _has_layer(module: str) -> bool:
    try:
        layer(module)
    except KeyError:
        return False
    return True


def test_no_arrows_up():
    assert arrows_up(_edges()) == []


def test_an_arrow_up_is_found_and_a_marked_one_is_not(tmp_path):
    # a planted import: the audit reaching up into the pipeline, at module level and lazily, then marked
    edges = _edges()
    edges["spectrace.audit.judge"]["spectrace.pipeline"] = False
    assert arrows_up(edges) == ["spectrace.audit.judge (audit) -> spectrace.pipeline (pipeline)"]
    package = tmp_path / "spectrace"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pipeline.py").write_text("")
    (package / "records.py").write_text(
        "def f():\n    from spectrace import pipeline\n\n\n"
        "def g():\n    from spectrace.pipeline import Batch  # layers: up (a test's reason)\n")
    planted = _edges({"spectrace": package / "__init__.py", "spectrace.pipeline": package / "pipeline.py",
                      "spectrace.records": package / "records.py"})
    assert planted["spectrace.records"] == {"spectrace.pipeline": False}  # one unmarked import: the arrow stands
    assert arrows_up(planted) == ["spectrace.records (leaves) -> spectrace.pipeline (pipeline)"]
    (package / "records.py").write_text("from spectrace.pipeline import Batch  # layers: up (a test's reason)\n")
    planted = _edges({"spectrace": package / "__init__.py", "spectrace.pipeline": package / "pipeline.py",
                      "spectrace.records": package / "records.py"})
    assert arrows_up(planted) == []


def test_the_layers_are_the_documented_ones():
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## The layers", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| (\d+) \| ([^|]+?) \|", section, re.M)
    assert [(int(i), name) for i, name in documented] == [(i, name) for i, (name, _) in enumerate(LAYERS)]


def test_only_the_plugin_imports_the_recorder():
    # spectrace.testing drives real vLLM runs for the tests and reads the run id back from the recorder; the collector
    # reads what the recorder ships (COLLECTOR_READS), and nothing else of it
    allowed = {"spectrace.plugin"}
    graph = _graph()
    importers = {
        name
        for name, targets in graph.items()
        if name.startswith("spectrace")
        and not name.startswith(("spectrace.recorder", "spectrace.testing", "spectrace.collector"))
        and any(t.startswith("spectrace.recorder") for t in targets)
    }
    assert importers <= allowed, importers
    read = {t for name, targets in graph.items() if name.startswith("spectrace.collector") for t in targets
            if t.startswith("spectrace.recorder")}
    assert read <= COLLECTOR_READS, read - COLLECTOR_READS


# What the collector imports of the recorder: the shipment and its record types, the runtime it builds in a pipeline
# process (runs, roles, telemetry) and the loss ledgers it writes.
COLLECTOR_READS = {"spectrace.recorder", "spectrace.recorder.wire", "spectrace.recorder.verify", "spectrace.recorder.verify.capture",
                   "spectrace.recorder.verify.run_config", "spectrace.recorder.runtime", "spectrace.recorder.losses"}


def test_read_and_audit_record_nothing():
    """The vLLM readers and the audit are pure: no runtime, no pipeline or sinks, no OpenTelemetry."""
    graph = _graph()
    paths = _modules()
    pure = [n for n in graph if n.startswith(("spectrace.vllm_objects", "spectrace.audit")) or n == "spectrace.audit.rules.acceptance"]
    assert "spectrace.vllm_objects.layers" in pure and "spectrace.audit.judge" in pure and "spectrace.audit.rules.acceptance" in pure
    recording = ("spectrace.recorder", "spectrace.pipeline", "spectrace.sinks", "spectrace.store",
                 "spectrace.lake", "spectrace.collector")
    for name in pure:
        assert not {t for t in graph[name] if t.startswith(recording)}, name
        assert "opentelemetry" not in paths[name].read_text(), name


# What vLLM's processes must not import from the recorder's own code: the judging (audit, the run rules), the flush
# (pipeline, sinks, store, lake, collector) and the array libraries it needs (numpy, pyarrow).
NOT_IN_THE_RECORDER = ("numpy", "pyarrow", "spectrace.audit", "spectrace.pipeline", "spectrace.sinks",
                       "spectrace.store", "spectrace.lake", "spectrace.collector")  # the run rules: spectrace.audit.rules
# Where the recorder still does one of those, each named with what it does: the thread shape hosts the collector in
# the traced process (Runtime's one choice of shape), and the API server's /metrics reads the exposition sink's
# files. (The load-time judges left the recorder: it hands their facts on, spectrace.load_facts.)
RECORDER_DEBTS = {
    "spectrace.recorder.runtime": {"spectrace.collector", "spectrace.sinks"},  # the thread shape; common_labels
    "spectrace.recorder.shipper": {"spectrace.sinks"},  # the exposition directory the pipeline process writes into
    "spectrace.recorder.api_server": {"spectrace.sinks"},  # the API server's /metrics collector
}


def _direct_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _forbidden(imported: set[str]) -> set[str]:
    return {prefix for prefix in NOT_IN_THE_RECORDER for name in imported if name == prefix or name.startswith(prefix + ".")}


def test_the_recorder_imports_no_numpy_pyarrow_audit_or_flush():
    recorder = {name: path for name, path in _modules().items() if name.startswith("spectrace.recorder")}
    assert {"spectrace.recorder.verify.hooks", "spectrace.recorder.verify.capture", "spectrace.recorder.wire",
            "spectrace.recorder.shipper"} <= set(recorder)
    found = {name: _forbidden(_direct_imports(path)) for name, path in recorder.items()}
    assert {name: bad for name, bad in found.items() if bad - RECORDER_DEBTS.get(name, set())} == {}
    # the hot path and what ships it: nothing of the kind, not even a debt
    for name in ("verify.hooks", "verify.hooks_v2", "verify.capture", "wire", "shipper", "around", "hooks"):
        assert not found[f"spectrace.recorder.{name}"] - {"spectrace.sinks"}, name
    # a debt paid is struck from the list
    assert {name for name, allowed in RECORDER_DEBTS.items() if not found[name] & allowed} == set()


def test_the_recorder_check_sees_a_planted_import():
    assert _forbidden({"numpy", "spectrace.recorder.wire"}) == {"numpy"}
    assert _forbidden({"spectrace.audit.codes"}) == {"spectrace.audit"}
    assert _forbidden({"spectrace.auditing", "pyarrowish", "spectrace.values"}) == set()

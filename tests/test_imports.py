"""The package's import graph: no cycles, and only the plugin reaches into the tracer.

Every ``import`` statement counts, at module level or inside a function, so a lazy
import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import spectrace

ROOT = Path(spectrace.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                # the deepest spectrace module the import names (a name imported from a module is that module)
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a module's own packages are imported before it anyway: no edge
                if target.startswith("spectrace") and not (name + ".").startswith(target + "."):
                    graph[name].add(target)
    return graph


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
    assert "spectrace.tracer.runtime" in graph["spectrace.tracer.verify.hooks"]
    assert "spectrace.vllm_objects.configs" in graph["spectrace.tracer.runtime"]
    assert "spectrace.audit" in graph["spectrace.doctor.diagnose"]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    graph = _graph()
    graph["spectrace.audit"].add("spectrace.doctor.diagnose")
    assert any({"spectrace.audit", "spectrace.doctor.diagnose"} <= set(c) for c in _cycles(graph))


def test_only_the_plugin_imports_the_tracer():
    # spectrace.testing drives real vLLM runs for the tests and reads the run id back from the tracer; the collector
    # reads what the recorder ships (COLLECTOR_READS), and nothing else of it
    allowed = {"spectrace.plugin"}
    graph = _graph()
    importers = {
        name
        for name, targets in graph.items()
        if not name.startswith(("spectrace.tracer", "spectrace.testing", "spectrace.collector"))
        and any(t.startswith("spectrace.tracer") for t in targets)
    }
    assert importers <= allowed, importers
    read = {t for name, targets in graph.items() if name.startswith("spectrace.collector") for t in targets
            if t.startswith("spectrace.tracer")}
    assert read <= COLLECTOR_READS, read - COLLECTOR_READS


# What the collector imports of the recorder: the shipment and its record types, the runtime it builds in a pipeline
# process (runs, roles, telemetry), the loss ledgers it writes, and the findings' emitter.
COLLECTOR_READS = {"spectrace.tracer", "spectrace.tracer.wire", "spectrace.tracer.verify", "spectrace.tracer.verify.capture",
                   "spectrace.tracer.verify.run_config", "spectrace.tracer.runtime", "spectrace.tracer.losses",
                   "spectrace.tracer.audit_live"}


def test_read_and_audit_record_nothing():
    """The vLLM readers and the audit are pure: no runtime, no pipeline or sinks, no OpenTelemetry."""
    graph = _graph()
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    pure = [n for n in graph if n.startswith(("spectrace.vllm_objects", "spectrace.audit")) or n == "spectrace.acceptance"]
    assert "spectrace.vllm_objects.layers" in pure and "spectrace.audit.judge" in pure and "spectrace.acceptance" in pure
    recording = ("spectrace.tracer", "spectrace.pipeline", "spectrace.sinks", "spectrace.store", "spectrace.lake")
    for name in pure:
        assert not {t for t in graph[name] if t.startswith(recording)}, name
        assert "opentelemetry" not in paths[name].read_text(), name

"""The package's import graph: no cycles, only the plugin reaches into the recorder, and the recorder judges nothing.

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
    assert "spectrace.recorder.runtime" in graph["spectrace.recorder.verify.hooks"]
    assert "spectrace.vllm_objects.configs" in graph["spectrace.recorder.runtime"]
    assert "spectrace.audit" in graph["spectrace.doctor.diagnose"]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detection_finds_a_planted_cycle():
    graph = _graph()
    graph["spectrace.audit"].add("spectrace.doctor.diagnose")
    assert any({"spectrace.audit", "spectrace.doctor.diagnose"} <= set(c) for c in _cycles(graph))


def test_only_the_plugin_imports_the_recorder():
    # spectrace.testing drives real vLLM runs for the tests and reads the run id back from the recorder; the collector
    # reads what the recorder ships (COLLECTOR_READS), and nothing else of it
    allowed = {"spectrace.plugin"}
    graph = _graph()
    importers = {
        name
        for name, targets in graph.items()
        if not name.startswith(("spectrace.recorder", "spectrace.testing", "spectrace.collector", "spectrace.tracer"))
        and any(t.startswith("spectrace.recorder") for t in targets)
    }
    assert importers <= allowed, importers
    read = {t for name, targets in graph.items() if name.startswith("spectrace.collector") for t in targets
            if t.startswith("spectrace.recorder")}
    assert read <= COLLECTOR_READS, read - COLLECTOR_READS


# What the collector imports of the recorder: the shipment and its record types, the runtime it builds in a pipeline
# process (runs, roles, telemetry), the loss ledgers it writes, and the findings' emitter.
COLLECTOR_READS = {"spectrace.recorder", "spectrace.recorder.wire", "spectrace.recorder.verify", "spectrace.recorder.verify.capture",
                   "spectrace.recorder.verify.run_config", "spectrace.recorder.runtime", "spectrace.recorder.losses",
                   "spectrace.recorder.audit_live"}


def test_read_and_audit_record_nothing():
    """The vLLM readers and the audit are pure: no runtime, no pipeline or sinks, no OpenTelemetry."""
    graph = _graph()
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    pure = [n for n in graph if n.startswith(("spectrace.vllm_objects", "spectrace.audit")) or n == "spectrace.acceptance"]
    assert "spectrace.vllm_objects.layers" in pure and "spectrace.audit.judge" in pure and "spectrace.acceptance" in pure
    recording = ("spectrace.recorder", "spectrace.pipeline", "spectrace.sinks", "spectrace.store", "spectrace.lake")
    for name in pure:
        assert not {t for t in graph[name] if t.startswith(recording)}, name
        assert "opentelemetry" not in paths[name].read_text(), name


# What vLLM's processes must not import from the recorder's own code: the judging (audit, the run rules), the flush
# (pipeline, sinks, store, lake, collector) and the array libraries it needs (numpy, pyarrow).
NOT_IN_THE_RECORDER = ("numpy", "pyarrow", "spectrace.audit", "spectrace.acceptance", "spectrace.slices",
                       "spectrace.speedup", "spectrace.pipeline", "spectrace.sinks", "spectrace.store",
                       "spectrace.lake", "spectrace.collector")
# Where the recorder still does one of those, each named with what it does. Judged in vLLM's processes today (the
# facts of a load or a config, judged where they are read): moving them to the collector means shipping those facts
# as records first. The thread shape hosts the collector in the traced process (Runtime's one choice of shape), and
# the API server's /metrics reads the exposition sink's files.
RECORDER_DEBTS = {
    "spectrace.recorder.audit_live": {"spectrace.audit"},  # the frontend's and engine core's static judge
    "spectrace.recorder.layout": {"spectrace.audit"},  # the worker's layout plans and LAYOUT_MISMATCH
    "spectrace.recorder.taps": {"spectrace.audit"},  # the worker's taps audit
    "spectrace.recorder.weights": {"spectrace.audit"},  # the worker's weights, dtype, rope and draft-settings audits
    "spectrace.recorder.verify.run_config": {"spectrace.audit"},  # RunConfig's context: the static judge's causes
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
    recorder = {_module_name(p): p for p in (ROOT / "recorder").rglob("*.py")}
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

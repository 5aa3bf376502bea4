"""Every `sglang:` Prometheus metric the pinned SGLang wheel declares, read with `ast` (no import).

A declaration is a call of `Counter`, `Gauge`, `Histogram`, `Summary` or SGLang's
`GaugeHistogram` under `sglang/srt/` whose name (first argument or `name=`) is a string literal
starting with `sglang:`. For each one this module reports the name as exposed, the Prometheus
type, the label names and the buckets:

- label names are read as written: literal lists, `labels.keys()`, `list(...) + [...]`,
  `[*labels.keys(), ...]`. A collector's `labels.keys()` stands for the keys of the dict literal
  SGLang builds those labels from (`LABEL_SOURCES`); conditional keys added later (`priority`
  with priority scheduling, `dp_rank` with data parallelism, user-supplied extra labels) are not
  part of it. Collectors whose labels come from their callers have `labels=None`;
- buckets are a literal list, or a local variable assigned exactly one literal list in the same
  function (SGLang's defaults); computed buckets are `None`;
- `GaugeHistogram` is exposed as a gauge with the extra labels `gt` and `le`;
- SGLang serves /metrics from prometheus_client's multiprocess collector, which adds a `pid`
  label to gauges in the default `multiprocess_mode` ("all", or "liveall");
- the help text is the literal `documentation` (`None` when SGLang formats it at run time).

The wheel comes from `tests.sglang_wheel` (fetched once with pip, then cached), so tests using
this module carry the `component` marker.
"""

from __future__ import annotations

import ast
import functools
import gc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from prometheus_client import Histogram
from prometheus_client import metrics_core as prometheus_metrics

from tests.sglang_wheel import unpacked_wheel


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse` with the garbage collector held off. CPython before 3.11.8 and 3.12.2
    (gh-106905) keeps one AST recursion counter per interpreter: a finalizer that parses
    while a tree is being built (an asyncio task a failed test left behind, logging its
    traceback) breaks the count, and the outer parse raises ``SystemError: AST constructor
    recursion depth mismatch``. CI's Python is 3.11.7."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if enabled:
            gc.enable()


PREFIX = "sglang:"
# The constructor a declaration calls -> the type Prometheus exposes.
KINDS: Mapping[str, str] = MappingProxyType(
    {
        "Counter": "counter",
        "Gauge": "gauge",
        "Histogram": "histogram",
        "Summary": "summary",
        "GaugeHistogram": "gauge",
    }
)
GAUGE_HISTOGRAM_LABELS = ("gt", "le")
# Gauge multiprocess modes whose series keep one child per process, labelled `pid`.
PER_PROCESS_MODES = frozenset({"all", "liveall"})
DEFAULT_MULTIPROCESS_MODE = "all"
# prometheus_client's default buckets, for a Histogram declared without `buckets`.
DEFAULT_BUCKETS = tuple(b for b in Histogram.DEFAULT_BUCKETS if b != float("inf"))
COLLECTORS_FILE = "srt/observability/metrics_collector.py"
# Collector class -> (file, function) holding the dict literal of the labels it spreads with
# `labels.keys()`: a `labels = {...}` assignment or a returned dict literal.
LABEL_SOURCES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "SchedulerMetricsCollector": (COLLECTORS_FILE, "SchedulerMetricsCollector.init_new"),
        "TokenizerMetricsCollector": (COLLECTORS_FILE, "tokenizer_metric_labels"),
        "RadixCacheMetricsCollector": (COLLECTORS_FILE, "radix_cache_metric_labels"),
    }
)
# Series a metric of each type exposes, by suffix of its base name (client_python's
# `_created` series are left out: nothing in tpuserve reads them).
SERIES_SUFFIXES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }
)


class UnreadableDeclaration(ValueError):
    """SGLang wrote a declaration in a shape this reader does not know; extend the reader."""


@dataclass(frozen=True, slots=True)
class DeclaredMetric:
    name: str  # as declared; counters are exposed with `_total` whether or not it is written
    kind: str  # counter | gauge | histogram | summary
    labels: tuple[str, ...] | None  # None: the collector's labels come from its callers
    buckets: tuple[float, ...] | None  # histograms: upper bounds without +Inf; None if computed
    documentation: str | None  # the help text; None when SGLang computes it (an f-string)
    collector: str | None  # the class declaring it
    where: str  # file:line inside the sglang package

    @property
    def family(self) -> str:
        """The family name client_python's parser reports (counters without `_total`)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    @property
    def series(self) -> tuple[str, ...]:
        """Every series name a PromQL query can select for this metric."""
        return tuple(self.family + suffix for suffix in SERIES_SUFFIXES[self.kind])


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _argument(call: ast.Call, keyword: str, position: int | None = None) -> ast.expr | None:
    """The argument passed as `keyword=`, or at `position` (prometheus_client's order)."""
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _is_labels_keys(node: ast.expr) -> bool:
    """`labels.keys()` or `self.labels.keys()`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    owner = node.func.value
    named = (isinstance(owner, ast.Name) and owner.id == "labels") or (
        isinstance(owner, ast.Attribute) and owner.attr == "labels"
    )
    return node.func.attr == "keys" and named and not node.args


def label_names(
    node: ast.expr | None, base: tuple[str, ...] | None, where: str
) -> tuple[str, ...] | None:
    """The label names `node` (a `labelnames=` argument) evaluates to; `base` is `labels.keys()`."""
    if node is None:
        return ()
    if _is_labels_keys(node):
        return base
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list":
        (inner,) = node.args
        return label_names(inner, base, where)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = label_names(node.left, base, where), label_names(node.right, base, where)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        out: list[str] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                part = label_names(element.value, base, where)
                if part is None:
                    return None
                out += part
            elif isinstance(element, ast.Constant) and isinstance(element.value, str):
                out.append(element.value)
            else:
                raise UnreadableDeclaration(f"{where}: label {ast.unparse(element)}")
        return tuple(out)
    raise UnreadableDeclaration(f"{where}: labelnames={ast.unparse(node)}")


def _literal_numbers(node: ast.expr) -> tuple[float, ...] | None:
    if not isinstance(node, ast.List | ast.Tuple):
        return None
    values: list[float] = []
    for element in node.elts:
        if not (isinstance(element, ast.Constant) and isinstance(element.value, int | float)):
            return None
        values.append(float(element.value))
    return tuple(values)


def _buckets(node: ast.expr | None, function: ast.AST | None) -> tuple[float, ...] | None:
    if node is None:
        return DEFAULT_BUCKETS
    literal = _literal_numbers(node)
    if literal is not None or not isinstance(node, ast.Name) or function is None:
        return literal
    assigned = [
        values
        for stmt in ast.walk(function)
        if isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets)
        and (values := _literal_numbers(stmt.value)) is not None
    ]
    return assigned[0] if len(assigned) == 1 else None


def _find_function(tree: ast.Module, qualified: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    *classes, name = qualified.split(".")
    for class_name in classes:
        found = [s for s in scope if isinstance(s, ast.ClassDef) and s.name == class_name]
        if not found:
            raise LookupError(f"no class {class_name} for {qualified}")
        scope = found[0].body
    for stmt in scope:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    raise LookupError(f"no function {qualified}")


def base_labels(tree: ast.Module, qualified: str) -> tuple[str, ...]:
    """Keys of the dict literal `qualified` assigns to `labels` or returns."""
    for node in ast.walk(_find_function(tree, qualified)):
        value: ast.expr | None = None
        if isinstance(node, ast.Return):
            value = node.value
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "labels" for t in node.targets
        ):
            value = node.value
        if isinstance(value, ast.Dict):
            keys = [k.value for k in value.keys if isinstance(k, ast.Constant)]
            if len(keys) == len(value.keys) and all(isinstance(k, str) for k in keys):
                return tuple(str(k) for k in keys)
    raise LookupError(f"{qualified} builds no labels dict literal")


class _Declarations(ast.NodeVisitor):
    def __init__(self, path: str, bases: Mapping[str, tuple[str, ...]], prefix: str) -> None:
        self.path = path
        self.bases = bases
        self.prefix = prefix
        self.classes: list[str] = []
        self.functions: list[ast.AST] = []
        self.found: list[DeclaredMetric] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def _in_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._in_function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._in_function(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        constructor = _call_name(node)
        name = _argument(node, "name", 0)
        if constructor is None or constructor not in KINDS:
            return
        if not (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and name.value.startswith(self.prefix)
        ):
            return
        kind = KINDS[constructor]
        where = f"{self.path}:{node.lineno}"
        collector = self.classes[-1] if self.classes else None
        base = self.bases.get(collector) if collector else None
        labels = label_names(_argument(node, "labelnames", 2), base, where)
        if constructor == "GaugeHistogram" and labels is not None:
            labels += GAUGE_HISTOGRAM_LABELS
        if constructor == "Gauge" and labels is not None:
            mode = _argument(node, "multiprocess_mode")
            if mode is not None and not isinstance(mode, ast.Constant):
                raise UnreadableDeclaration(f"{where}: multiprocess_mode={ast.unparse(mode)}")
            if (DEFAULT_MULTIPROCESS_MODE if mode is None else mode.value) in PER_PROCESS_MODES:
                labels += ("pid",)
        function = self.functions[-1] if self.functions else None
        buckets = _buckets(_argument(node, "buckets"), function) if kind == "histogram" else ()
        doc = _argument(node, "documentation", 1)
        text = doc.value if isinstance(doc, ast.Constant) and isinstance(doc.value, str) else None
        self.found.append(DeclaredMetric(name.value, kind, labels, buckets, text, collector, where))


def declarations_in(
    source: str, path: str, bases: Mapping[str, tuple[str, ...]], prefix: str = PREFIX
) -> list[DeclaredMetric]:
    """The declarations in one module's source; `bases` gives each collector's base labels."""
    visitor = _Declarations(path, bases, prefix)
    visitor.visit(parse(source, path))
    return visitor.found


def _files(package: Path) -> Iterator[Path]:
    for path in sorted((package / "srt").rglob("*.py")):
        if PREFIX in path.read_text(encoding="utf-8"):
            yield path


@functools.cache
def declared_metrics(version: str | None = None) -> Mapping[str, DeclaredMetric]:
    """Every `sglang:` metric of the pinned (or given) SGLang version, by declared name."""
    package = unpacked_wheel(version)
    trees: dict[str, ast.Module] = {}

    def tree(relative: str) -> ast.Module:
        if relative not in trees:
            trees[relative] = parse((package / relative).read_text(encoding="utf-8"))
        return trees[relative]

    bases = {cls: base_labels(tree(file), fn) for cls, (file, fn) in LABEL_SOURCES.items()}
    found: dict[str, DeclaredMetric] = {}
    for path in _files(package):
        relative = path.relative_to(package).as_posix()
        for metric in declarations_in(path.read_text(encoding="utf-8"), relative, bases):
            earlier = found.setdefault(metric.name, metric)
            if (earlier.kind, earlier.labels) != (metric.kind, metric.labels):
                raise UnreadableDeclaration(
                    f"{metric.name} declared twice differently: {earlier.where}, {metric.where}"
                )
    if not found:
        raise LookupError(f"no {PREFIX} metric declared under {package / 'srt'}")
    return MappingProxyType(found)


def declared_series(version: str | None = None) -> Mapping[str, DeclaredMetric]:
    """Every series name a query may select, to the metric exposing it."""
    return MappingProxyType(
        {series: m for m in declared_metrics(version).values() for series in m.series}
    )


def loop_values(
    relative: str, function: str, target: str, version: str | None = None
) -> tuple[str, ...]:
    """The string literals `function` loops over as `for <target> in (...)`: label values SGLang
    sets, e.g. the `phase`s of `TokenizerMetricsCollector.emit_startup_time`."""
    tree = parse((unpacked_wheel(version) / relative).read_text(encoding="utf-8"))
    for node in ast.walk(_find_function(tree, function)):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and node.target.id == target
            and isinstance(node.iter, ast.Tuple | ast.List)
        ):
            return tuple(
                e.value
                for e in node.iter.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    raise LookupError(f"{function} loops over no literal with {target}")


IGNORED_SAMPLE_LABELS = frozenset({"le", "quantile"})


@dataclass(frozen=True, slots=True)
class ExposedFamily:
    """What a live /metrics shows of one family: its type, label names and buckets."""

    kind: str
    labels: frozenset[str]  # over every sample, without `le` and `quantile`
    buckets: tuple[float, ...] | None  # histograms: upper bounds without +Inf

    def __str__(self) -> str:
        buckets = "" if self.buckets is None else f", buckets {list(self.buckets)}"
        return f"{self.kind}, labels {sorted(self.labels)}{buckets}"


def exposed_families(
    families: Iterable[prometheus_metrics.Metric], prefix: str = PREFIX
) -> dict[str, ExposedFamily]:
    """The `prefix` families of a parsed exposition (`text_string_to_metric_families`)."""
    out = {}
    for family in families:
        if not family.name.startswith(prefix):
            continue
        labels = {k for s in family.samples for k in s.labels} - IGNORED_SAMPLE_LABELS
        buckets = None
        if family.type == "histogram":
            bounds = {float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")}
            buckets = tuple(sorted(bounds - {float("inf")}))
        out[family.name] = ExposedFamily(family.type, frozenset(labels), buckets)
    return out


def undeclared(names: Iterable[str], version: str | None = None) -> set[str]:
    """The `sglang:` names among `names` that no declaration of the pinned SGLang exposes."""
    series = declared_series(version)
    return {n for n in names if n.startswith(PREFIX) and n not in series}

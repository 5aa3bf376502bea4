"""The router's series kinds, kept in plain Python numbers for the hot path: `Counter`, `Gauge`
and `Histogram` mirror client_python's ``labels(...).inc()/observe()/set()``, but a child is
a bare value with no lock (the router is one event loop) and ``labels(...)`` one dict look-up;
`SeriesCollector` renders them all at scrape time through a normal `CollectorRegistry`. The
router's own series are `metrics`'."""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

C = TypeVar("C")


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class Series(ABC, Generic[C]):
    """A named series family with labelled children (client_python's labels() interface).

    ``labels(...)`` is the one cache of children: a child is made on first use and kept
    until `remove_by_labels` drops it, so callers look children up per request instead of
    keeping copies that could outlive a departed worker.
    """

    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], C] = {}

    @abstractmethod
    def _new(self) -> C: ...

    @abstractmethod
    def family(self) -> Metric:
        """The family as client_python exposes it, with every child."""

    def labels(self, *values: str) -> C:
        """The child for these label values, made on first use (children are never falsy)."""
        return self.children.get(values) or self._add(values)

    def child(self, values: tuple[str, ...]) -> C:
        """`labels` for a tuple already built (one key serves several families)."""
        return self.children.get(values) or self._add(values)

    def _add(self, values: tuple[str, ...]) -> C:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
        child = self.children[values] = self._new()
        return child

    def remove_by_labels(self, labels: dict[str, str]) -> None:
        positions = {self.labelnames.index(k): v for k, v in labels.items()}
        for key in [k for k in self.children if all(k[i] == v for i, v in positions.items())]:
            del self.children[key]


class Counter(Series[_Value]):
    kind = "counter"

    def _new(self) -> _Value:
        return _Value()

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in self.children.items():
            family.add_metric(key, child.value)
        return family


class Gauge(Counter):
    kind = "gauge"

    def family(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in self.children.items():
            family.add_metric(key, child.value)
        return family


class Histogram(Series[_Buckets]):
    kind = "histogram"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, documentation, labelnames)
        self.bounds = tuple(float(b) for b in buckets)

    def _new(self) -> _Buckets:
        return _Buckets(self.bounds)

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in self.children.items():
            cumulative = 0
            buckets = []
            for bound, count in zip((*self.bounds, float("inf")), child.counts, strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(list(key), buckets, child.sum)
        return family


class SeriesCollector(Collector):
    def __init__(self, series: Iterable[Series[Any]]) -> None:
        self.series = list(series)

    def collect(self) -> Iterator[Metric]:
        for series in self.series:
            yield series.family()

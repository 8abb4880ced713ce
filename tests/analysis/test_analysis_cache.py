"""The analysis layer's bounded cache (mltrace.analysis.cache.LruCache) and the two caches built
on it: entries are made on first use, filled in place, and the least recently used go first."""

from __future__ import annotations

import threading

from mltrace.analysis import SeriesCache, StatisticCache, StepValues
from mltrace.analysis.cache import LruCache


def test_entries_are_created_once_and_filled_in_place() -> None:
    made: list[int] = []

    def create() -> dict[int, float]:
        made.append(1)
        return {}

    cache: LruCache[dict[int, float]] = LruCache(create, max_entries=4)
    cache.get("loss")[3] = 0.5
    assert cache.get("loss") == {3: 0.5}
    assert len(made) == 1


def test_least_recently_used_entry_goes_first() -> None:
    cache: LruCache[list[str]] = LruCache(list, max_entries=2)
    cache.get("a").append("a")
    cache.get("b").append("b")
    cache.get("a")  # "a" is now the most recent: "b" is the one dropped next
    cache.get("c")
    assert cache.get("a") == ["a"]
    assert cache.get("b") == []  # made again, empty


def test_threads_share_one_entry_per_key() -> None:
    cache: LruCache[list[int]] = LruCache(list, max_entries=8)
    seen: list[int] = []

    def worker() -> None:
        seen.append(id(cache.get("k")))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1


def test_series_and_statistic_caches_keep_their_bounds_and_entry_types() -> None:
    series = SeriesCache(max_series=1)
    assert series.max_series == 1 and series.get(("t", "x")) == {}
    series.get(("t", "x"))[0] = {"mean": 1.0}
    series.get(("t", "y"))
    assert series.get(("t", "x")) == {}  # dropped beyond max_series
    series.max_series = 5
    assert series.max_entries == 5

    statistics = StatisticCache(max_entries=3)
    entry = statistics.get(("t", "x", "l2", None))
    assert isinstance(entry, StepValues) and entry.steps.size == 0
    assert statistics.get(("t", "x", "l2", None)) is entry

"""Prompt lookup's index: matches, no match, long histories, syncing across turns."""

import time

import pytest

from dflash_mlx.engine.lookup import LookupIndex


def _index(tokens, **kw):
    index = LookupIndex(**kw)
    index.extend(tokens)
    return index


def test_proposes_what_followed_the_latest_earlier_match():
    index = _index([5, 6, 7, 8, 9, 1, 6, 7])  # ends with 6, 7: seen at 1-2
    assert index.propose(3) == [8, 9, 1]
    assert index.match == 2
    assert index.propose(1) == [8]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # "2 3" last occurred at the end (followed by 9), but "1 2 3" earlier (then 4)
    index = _index([1, 2, 3, 4, 0, 2, 3, 9, 7, 1, 2, 3])
    assert index.propose(2) == [4, 0]
    assert index.match == 3


def test_the_most_recent_occurrence_of_the_longest_match_wins():
    index = _index([1, 2, 3, 1, 2, 4, 1, 2], max_ngram=2)
    assert index.propose(1) == [4]


def test_no_match_proposes_nothing():
    index = _index([1, 2, 3, 4, 5])
    assert index.propose(4) == [] and index.match == 0
    assert _index([7]).propose(3) == []
    assert LookupIndex().propose(3) == []
    # a 1-gram match is not enough when min_ngram asks for 2
    assert _index([1, 2, 3, 9, 3], min_ngram=2).propose(2) == []
    assert _index([1, 2, 3, 9, 3], min_ngram=1).propose(2) == [9, 3]


def test_a_copy_reaching_the_end_repeats_with_its_period():
    index = _index([4, 1, 2, 1, 2])  # "1 2" seen at 1-2, followed by "1 2"
    assert index.propose(5) == [1, 2, 1, 2, 1]
    assert _index([3, 3]).propose(4) == [3, 3, 3, 3]


def test_limit_below_one_proposes_nothing():
    assert _index([1, 2, 1]).propose(0) == []


def test_sync_extends_a_prefix_and_starts_over_otherwise():
    index = _index([1, 2, 3, 4])
    tables = index._tables
    index.sync([1, 2, 3, 4, 5, 1, 2])  # the next turn: only the tail is new
    assert index._tables is tables and index.tokens == [1, 2, 3, 4, 5, 1, 2]
    assert index.propose(2) == [3, 4]
    index.sync([9, 8, 9])  # another conversation: indexed afresh
    assert index.tokens == [9, 8, 9] and index.propose(1) == [8]
    assert index._tables is not tables
    index.sync([9, 8])  # shorter than what is held: afresh too
    assert index.tokens == [9, 8] and index.propose(1) == []


def test_a_long_history_costs_the_same_per_token():
    """No scan of the history: each extend adds at most one entry per n, and the cost
    of adding and proposing does not grow with the history."""
    index = LookupIndex(min_ngram=1, max_ngram=4)
    copy = list(range(100_000, 100_040))
    history = copy + [i % 5000 + 1000 for i in range(200_000)] + copy[:6]
    index.extend(history)
    assert sum(len(t) for t in index._tables) <= 4 * len(history)
    assert index.propose(8) == copy[6:14] and index.match == 4  # 200K tokens back

    def cost(n_before):  # the best of three runs: the machine may be busy
        fresh = LookupIndex()
        fresh.extend(range(n_before))
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            for i in range(5_000):
                fresh.extend([i % 7])
                fresh.propose(8)
            runs.append(time.perf_counter() - start)
        return min(runs)

    assert cost(200_000) < 3 * cost(1_000)


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        ({"min_ngram": 0}, "min_ngram must be an integer from 1 to 64"),
        ({"max_ngram": True}, "max_ngram must be an integer from 1 to 64"),
        ({"min_ngram": 3, "max_ngram": 2}, "must be at least min_ngram"),
        ({"max_ngram": 2.5}, "max_ngram must be an integer"),
    ],
)
def test_bad_settings_name_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        LookupIndex(**kwargs)

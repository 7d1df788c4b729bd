"""bracket.search: the one largest-batch loop (measuring, tuning, the planner's capacity search)."""

from gpuwise import bracket
from gpuwise.plan.capacity import _crossing


def test_monotone_doubles_then_bisects_to_the_largest_that_fits():
    tried = []

    def fits(b):
        tried.append(b)
        return b <= 100

    found = bracket.search(fits, 1)
    assert found == bracket.Searched(100, 101, tried, "")
    assert tried == [1, 2, 4, 8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]


def test_seed_mode_confirms_a_good_seed_in_few_trials():
    found = bracket.search(lambda b: b <= 1000, 990, step=8)
    assert (found.largest_ok, found.smallest_fail) == (1000, 1001)
    assert found.tried == [990, 998, 1006, 1002, 1000, 1001]


def test_non_monotone_memory_settles_a_crossing():
    # README: "1553 fits, 1554 does not, 1559 fits again" (allocator layout); the answer is the crossing
    # the search settles: a batch that fits whose neighbour above does not
    def fits(b):
        return b <= 1553 or 1559 <= b <= 1570

    found = bracket.search(fits, 1)
    ok = found.largest_ok
    assert fits(ok) and not fits(ok + 1) and found.smallest_fail == ok + 1
    assert ok == 1570      # 1024 fits, 2048 not, 1536, 1792 no, 1664 no, 1600 no, 1568 yes ... 1570
    seeded = bracket.search(fits, 1550, step=1)
    assert (seeded.largest_ok, seeded.smallest_fail) == (1553, 1554)


def test_the_bracket_starts_where_earlier_trials_left_it_and_never_leaves_it():
    tried = []
    found = bracket.search(lambda b: tried.append(b) or b <= 37, 1, largest_ok=32, smallest_fail=64)
    assert all(32 < b < 64 for b in tried)
    assert (found.largest_ok, found.smallest_fail) == (37, 38)


def test_limit_guess_trials_time_and_error_stop_the_loop():
    assert bracket.search(lambda b: True, 1, limit=20) == bracket.Searched(20, None, [1, 2, 4, 8, 16, 20], "")
    assert bracket.search(lambda b: b <= 50, 1, guess=50).tried[:2] == [50, 100]
    assert bracket.search(lambda b: True, 1, max_trials=3) == bracket.Searched(4, None, [1, 2, 4], "trials")
    calls = iter([False, False, True])
    assert bracket.search(lambda b: True, 1, out_of_time=lambda: next(calls)).stopped == "time"
    assert bracket.search(lambda b: None if b == 4 else True, 1) == bracket.Searched(2, None, [1, 2, 4], "error")


def test_capacity_crossing_is_the_search_from_its_guess():
    for edge in (1, 7, 64, 65, 1000):
        for guess in (1, 5, 64, 300, 5000):
            assert _crossing(lambda b, e=edge: b <= e, 0, None, guess) == edge
    assert _crossing(lambda b: b <= 40, 30, 45, 44) == 40
    assert _crossing(lambda b: True, 30, 45, 31) == 44          # hi is taken not to fit
    assert _crossing(lambda b: False, 30, 45, 40) == 30         # lo is taken to fit


def test_a_guess_that_learns_is_asked_afresh_each_round_and_only_while_the_bracket_is_open():
    # plan/capacity.py's model guesses anew after every trace; a guess outside the open bracket is ignored
    asked = []

    def guess(ok, fail):
        asked.append((ok, fail))
        return 70 if fail is None else 1000

    found = bracket.search(lambda b: b <= 70, 1, guess=guess)
    assert found.tried == [70, 140, 105, 87, 78, 74, 72, 71]
    assert (found.largest_ok, found.smallest_fail) == (70, 71)
    assert asked[:2] == [(None, None), (70, None)] and len(asked) == len(found.tried)

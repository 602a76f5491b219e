from core.engine.drafters.ngram import NgramDrafter


def lookup(history, k):
    d = NgramDrafter()
    d.begin(history)
    return d.lookup(history, k)


def test_longest_suffix_wins():
    # suffix (1, 2, 3) occurred at 0..2 followed by 9; (2, 3) alone also at 5..6 followed by 8
    h = [1, 2, 3, 9, 0, 2, 3, 8, 1, 2, 3]
    assert lookup(h, 2) == [9, 0]


def test_falls_back_to_shorter_ngrams():
    h = [5, 7, 1, 4, 4, 6, 7]  # (4, 6, 7) and (6, 7) never seen before; (7,) was: followed by 1
    assert lookup(h, 3) == [1, 4, 4]


def test_latest_match_is_used():
    h = [3, 1, 3, 2, 3]  # (3,) occurred at 0 (then 1) and at 2 (then 2): the latest wins
    assert lookup(h, 1) == [2]


def test_no_match_and_k_zero():
    assert lookup([1, 2, 3, 4], 4) == []
    assert lookup([1, 1, 1], 0) == []


def test_overlapping_match_copies_forward():
    # a run of one token predicts the run continuing, for all k tokens
    assert lookup([7, 7, 7], 4) == [7, 7, 7, 7]
    assert lookup([1, 2, 1, 2, 1], 5) == [2, 1, 2, 1, 2]


def test_incremental_index_matches_fresh_index():
    d = NgramDrafter()
    h = [4, 5, 6]
    d.begin(h)
    d.lookup(h, 2)
    for t in [4, 5, 9, 4, 5]:
        h.append(t)
        assert d.lookup(h, 3) == lookup(list(h), 3)

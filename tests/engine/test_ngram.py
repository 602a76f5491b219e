from core.engine.drafters.ngram import PromptLookup, TextIndex


def lookup(history, k):
    d = PromptLookup()
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
    d = PromptLookup()
    h = [4, 5, 6]
    d.lookup(h, 2)
    for t in [4, 5, 9, 4, 5]:
        h.append(t)
        assert d.lookup(h, 3) == lookup(list(h), 3)


class ToyCodec:
    """Greedy longest-match tokenizer over a fixed vocabulary: enough to make a model's
    token split differ from the prompt's."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            best = max(
                (j for j, v in enumerate(self.vocab) if text.startswith(v, i)),
                key=lambda j: len(self.vocab[j]),
            )
            ids.append(best)
            i += len(self.vocab[best])
        return ids


def text_drafter(codec: ToyCodec) -> PromptLookup:
    return PromptLookup(text=TextIndex(codec.decode, codec.encode))


def test_text_match_finds_a_copy_the_tokens_split_differently():
    codec = ToyCodec([" maria", '"', "maria", '"mar', "ia", ".lopez", "@x", " ("])
    prompt = codec.encode(" (maria.lopez@x")  # the prompt splits " (" + "maria"
    out = [3, 4]  # the model wrote '"mar' + 'ia': token 'ia' never occurred before
    h = prompt + out
    assert lookup(h, 3) == []  # token n-grams see nothing to copy
    d = text_drafter(codec)
    # what followed "maria" earlier, up to the text written since: '.lopez@x"mar...'
    assert d.lookup(h, 3) == codec.encode('.lopez@x"mar')


def test_text_match_refuses_a_continuation_that_retokenizes_the_tail():
    codec = ToyCodec(["p", "q", "r", "s", "t", "rs"])
    h = [0, 1, 2, 3, 4, 0, 1, 2]  # "pqrst" then "pqr", written as single letters
    idx = TextIndex(codec.decode, codec.encode)
    # "pqr" + "st..." re-tokenizes as p, q, rs, t: not how the model wrote its last tokens
    assert idx.lookup(h, 2) == []
    d = text_drafter(codec)
    assert d.lookup(h, 2) == [3, 4]  # so the token matcher answers


def test_text_match_drops_a_token_cut_at_the_continuation_end():
    codec = ToyCodec(["a", "b", "c", "d", "cd", "abcd", "x"])
    h = codec.encode("xabcdxabcdx")  # the continuation after "x" is "abcdx..." cut short
    idx = TextIndex(codec.decode, codec.encode)
    got = idx.lookup(h, 1)  # 9 characters of text: "abcdxabcd" -> abcd, x, abcd (cut)
    assert got == [codec.vocab.index("abcd")]


def test_text_index_extends_its_cache_and_matches_fresh():
    codec = ToyCodec(list("abcdefgh") + ["ab", "cd"])
    h = codec.encode("abcdefgh")
    d = text_drafter(codec)
    for t in codec.encode("abcdeabcd"):
        h.append(t)
        fresh = text_drafter(codec)
        assert d.lookup(h, 4) == fresh.lookup(h, 4)

"""The worker's engine thread: items from several submitters in one batch, results per
item as rows finish, take-back of what has not started, cancels, one copy of the weights."""

import threading
import time

import pytest

from core.engine import CostSurface, GenerationParams
from worker.runtime import Cancelled, Runtime, Work


@pytest.fixture
def runtimes():
    made = []
    yield made
    for rt in made:
        rt.close()
        assert not rt._thread or not rt._thread.is_alive()


@pytest.fixture
def _runtime(monkeypatch, runtimes):
    monkeypatch.setattr("core.engine.engine.load_or_measure", lambda *a, **k: CostSurface.flat())

    def make(batch_size):
        rt = Runtime(batch_size)
        runtimes.append(rt)
        return rt

    return make


def _work(n, done, on_admit=None, key=("tiny-random:7", "ngram", None), tokens=8):
    return Work(
        key=key,
        prompt=lambda target, n=n: target.encode_prompt(f"item {n}: copy copy copy"),
        params=GenerationParams(max_tokens=tokens),
        done=done,
        on_admit=on_admit,
        tag=n,
        id=n,
    )


def test_items_from_several_threads_share_one_batch(_runtime):
    rt = _runtime(batch_size=8)
    results = {}
    lock = threading.Lock()

    def done(w, r, e):
        with lock:
            results[w.tag] = (r, e)

    def submit(start):
        for n in range(start, start + 4):
            rt.submit(_work(n, done))

    threads = [threading.Thread(target=submit, args=(s,)) for s in (0, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rt.drain(60)
    assert sorted(results) == list(range(8))
    assert all(e is None and len(r.tokens) == 8 for r, e in results.values())
    assert max(r.timing["batch_size"] for r, _ in results.values()) > 1.0
    # the same prompt alone gives the same tokens (a batch changes nothing)
    alone = rt.engine("tiny-random:7", "none").generate(
        rt.model("tiny-random:7").encode_prompt("item 3: copy copy copy"),
        GenerationParams(max_tokens=8),
    )
    assert results[3][0].tokens == alone.tokens


def test_one_copy_of_the_weights_per_model(_runtime):
    rt = _runtime(batch_size=2)
    a, b = rt.engine("tiny-random:7", "ngram"), rt.engine("tiny-random:7", "auto", 3)
    assert a is not b and a.target is b.target


def test_take_back_returns_what_has_not_started(_runtime):
    rt = _runtime(batch_size=1)
    done = []
    started = threading.Event()

    def slow_admit():
        started.set()
        time.sleep(0.3)

    rt.submit(_work(0, lambda w, r, e: done.append(w.tag), on_admit=slow_admit, tokens=40))
    for n in range(1, 5):
        rt.submit(_work(n, lambda w, r, e: done.append(w.tag)))
    assert started.wait(30)
    taken = rt.take_back()
    assert rt.drain(60)
    assert {w.tag for w in taken} | set(done) == {0, 1, 2, 3, 4}
    assert 0 in done and len(taken) >= 3  # one row ran, the queued ones came back


def test_cancel_stops_queued_and_running_rows(_runtime):
    rt = _runtime(batch_size=2)
    out = {}
    started = threading.Event()
    rt.submit(_work(0, lambda w, r, e: out.setdefault(w.tag, e), on_admit=started.set, tokens=400))
    for n in range(1, 4):
        rt.submit(_work(n, lambda w, r, e: out.setdefault(w.tag, e), tokens=400))
    assert started.wait(30)
    rt.cancel({0, 1, 2, 3})
    assert rt.drain(60)
    assert set(out) == {0, 1, 2, 3}
    assert all(isinstance(e, Cancelled) for e in out.values())


def test_a_bad_model_fails_its_item_alone(_runtime):
    rt = _runtime(batch_size=2)
    out = {}
    rt.submit(
        _work(
            0, lambda w, r, e: out.setdefault(w.tag, (r, e)), key=("no-such-model", "ngram", None)
        )
    )
    rt.submit(_work(1, lambda w, r, e: out.setdefault(w.tag, (r, e))))
    assert rt.drain(60)
    assert out[0][1] is not None and out[1][1] is None


def test_answers_shared_by_other_workers_reach_the_jobs_suffix_index(_runtime):
    """Another worker's answers, handed to `share`, are in the job's index before this
    worker's rows of the job draft; `forget` drops the job's index."""
    rt = _runtime(batch_size=4)
    key = ("tiny-random:7", "suffix", None)
    done = threading.Event()
    rt.submit(_work(0, lambda *a: done.set(), key=key))
    assert done.wait(60)
    engine = rt._engines[key]
    rt.share(key, "job-1", ["the answer of another worker", "and one more"])
    rt.share(("tiny-random:7", "none", None), "job-1", ["an engine not running here"])
    again = threading.Event()
    w = _work(1, lambda *a: again.set(), key=key)
    w.job = "job-1"
    rt.submit(w)
    assert again.wait(60)
    index = engine.corpora.get("job-1")
    texts = [t for t, weight in index.docs if weight == 1.0]
    assert texts[:2] == ["the answer of another worker", "and one more"]
    assert len(texts) == 3  # and this worker's own answer, added as its row finished
    rt.forget("job-1")
    rt.submit(_work(2, lambda *a: None, key=key))
    assert rt.drain(60)
    assert "job-1" not in engine.corpora

"""reconcile_all checks pipelines side by side (consumers/reconciliation/reconcile.py `side_by_side`)."""
import threading

from consumers.reconciliation.reconcile import side_by_side


def test_each_item_is_worked_once_in_several_threads_and_the_results_keep_the_items_order():
    seen, started, lock = [], threading.Barrier(3, timeout=10), threading.Lock()

    def work(item):
        if item < 3:
            started.wait()   # the first three run at once: three threads, not one after another
        with lock:
            seen.append((item, threading.current_thread().name))
        return item * 10

    assert side_by_side(work, list(range(20)), threads=3) == [i * 10 for i in range(20)]
    assert sorted(item for item, _ in seen) == list(range(20))
    assert len({name for _, name in seen}) == 3


def test_one_thread_or_one_item_works_in_the_callers_thread():
    here = threading.current_thread().name
    assert side_by_side(lambda item: threading.current_thread().name, [1, 2], threads=1) == [here, here]
    assert side_by_side(lambda item: threading.current_thread().name, [1], threads=4) == [here]

"""consumers.waiting: the one bounded polling loop."""
import pytest

from consumers.waiting import wait_until


def test_it_returns_the_first_truthy_answer_pausing_between_asks():
    answers = iter([None, [], ["run 7"], ["never asked"]])
    pauses = []
    assert wait_until(lambda: next(answers), 3600, interval=0.5, pause=pauses.append) == ["run 7"]
    assert pauses == [0.5, 0.5]


def test_past_its_deadline_it_returns_the_last_falsy_answer_having_asked_at_least_once():
    asked = []
    assert wait_until(lambda: asked.append(1) or 0, 0, pause=lambda _: None) == 0
    assert asked == [1]


def test_an_error_in_the_condition_ends_the_wait():
    def exited():
        raise RuntimeError("exited with code 1")

    with pytest.raises(RuntimeError, match="code 1"):
        wait_until(exited, 3600, pause=lambda _: None)

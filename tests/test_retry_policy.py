"""The session's own retries of a model turn (`workflows.policies.model_retry_delay`): how long it waits, and when it
gives up. The sessions that retry are tested end to end in test_session_errors.py; this is the arithmetic."""

from __future__ import annotations

from corral.contract.errors import ModelErrorInfo
from corral.contract.session import ModelRetryConfig
from workflows.policies import model_retry_delay

OVERLOADED = ModelErrorInfo(error_type="model_overloaded_error", status=529, retryable=True)


def test_the_delay_doubles_from_the_first_up_to_the_most() -> None:
    retry = ModelRetryConfig(max_attempts=8, initial_delay_seconds=1.0, max_delay_seconds=10.0)
    delays = [model_retry_delay(retry, OVERLOADED, attempt) for attempt in range(1, 8)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_the_models_retry_after_wins_over_the_back_off() -> None:
    retry = ModelRetryConfig(initial_delay_seconds=1.0, max_delay_seconds=10.0)
    asked = OVERLOADED.model_copy(update={"retry_after": 30.0})
    assert model_retry_delay(retry, asked, 1) == 30.0
    assert model_retry_delay(retry, OVERLOADED.model_copy(update={"retry_after": 0.0}), 1) == 0.0


def test_the_session_gives_up_once_its_attempts_are_spent() -> None:
    retry = ModelRetryConfig(max_attempts=3)
    assert model_retry_delay(retry, OVERLOADED, 2) is not None
    assert model_retry_delay(retry, OVERLOADED, 3) is None
    assert model_retry_delay(ModelRetryConfig(max_attempts=1), OVERLOADED, 1) is None


def test_an_error_that_is_not_transient_is_not_retried() -> None:
    fatal = ModelErrorInfo(error_type="billing_error", status=402, retryable=False, retry_after=5.0)
    assert model_retry_delay(ModelRetryConfig(), fatal, 1) is None

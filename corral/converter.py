"""The payload converter of every corral client and worker: pydantic models as JSON, and input that does not fit
its model as a typed, non-retryable failure that says what is wrong, instead of an exception Temporal retries.

Where this matters: a session started with a bad input (from the `temporal` CLI, say) fails at once with
`InvalidInput` listing the fields, rather than retrying its first workflow task forever while it shows Running.
A bad signal is still dropped with a warning and a bad update still rejected: the SDK handles those itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.exceptions import ApplicationError

INVALID_INPUT = "InvalidInput"
MAX_PROBLEMS = 10


class CorralPayloadConverter(PydanticPayloadConverter):
    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        try:
            return super().from_payloads(payloads, type_hints)
        except ValidationError as exc:
            raise ApplicationError(describe(exc), type=INVALID_INPUT, non_retryable=True) from None


def describe(exc: ValidationError) -> str:
    """`field.path: what is wrong` for each problem (at most `MAX_PROBLEMS`), on one line."""
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'input'}: {error['msg']}"
        for error in exc.errors(include_url=False)
    ]
    more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
    return f"invalid {exc.title}: " + "; ".join(problems[:MAX_PROBLEMS]) + more

"""The user events a session takes (the `send_events` update and the `user_message` and `interrupt` signals) and how
a batch of them is checked before anything reaches history. Field names follow the Managed Agents API."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from corral.contract.events import ContentBlock, TextBlock, TextRubric
from corral.contract.limits import SendableInput

MAX_MESSAGE_BYTES = 32 * 1024 * 1024
"""The most bytes of user events one batch may carry (the Messages API's own request limit). Anything over 256 KiB
is kept in the blob store with only a reference in history (corral.blobs), so no history payload nears Temporal's
2 MB limit; the model is shown a block too large for its context as a note (corral.contract.context.fit_blocks)."""
MAX_EVENTS_PER_BATCH = 50
MAX_RUBRIC_CHARS = 262_144
"""A text rubric's most characters (upstream's 256 KB)."""
DEFAULT_OUTCOME_ITERATIONS = 3
MAX_OUTCOME_ITERATIONS = 20

MessageContent = str | list[ContentBlock]


def normalize_content(content: MessageContent) -> list[ContentBlock]:
    """Turn a plain string into one text block, and refuse empty content."""
    blocks: list[ContentBlock] = [TextBlock(text=content)] if isinstance(content, str) else list(content)
    if not blocks or all(isinstance(b, TextBlock) and not b.text.strip() for b in blocks):
        raise ValueError("content must not be empty")
    return blocks


# ---- inputs of signals and the send_events update ------------------------------------------------------


class UserMessageSignal(SendableInput):
    """Input of the `user_message` signal: `{"content": "..."}` plus an optional client id for de-duplication."""

    model_config = ConfigDict(extra="forbid")
    content: MessageContent
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserMessageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.message"]
    content: MessageContent
    id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("content")
    @classmethod
    def _content_not_empty(cls, value: MessageContent) -> MessageContent:
        normalize_content(value)
        return value


class UserInterruptParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.interrupt"]
    id: str | None = Field(default=None, min_length=1, max_length=128)
    session_thread_id: str | None = Field(default=None, min_length=1, max_length=128)
    """Interrupt only this thread; absent, every thread that is not archived."""


class UserToolConfirmationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.tool_confirmation"]
    tool_use_id: str
    result: Literal["allow", "deny"]
    deny_message: str | None = None
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserCustomToolResultParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["user.custom_tool_result"]
    custom_tool_use_id: str
    content: MessageContent = Field(default_factory=list)
    is_error: bool = False
    id: str | None = Field(default=None, min_length=1, max_length=128)


class UserToolResultParams(BaseModel):
    """A self-hosted worker's result of a built-in call that the session routed to it (corral.contract.work)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["user.tool_result"]
    tool_use_id: str
    content: MessageContent = Field(default_factory=list)
    is_error: bool = False
    id: str | None = Field(default=None, min_length=1, max_length=128)


class SystemMessageParams(BaseModel):
    """Privileged context for the turn of the event it follows and every later one (the SDK's
    `BetaManagedAgentsSystemMessageEventParams`): text only, since it joins the system prompt."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["system.message"]
    content: list[TextBlock]
    id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("content")
    @classmethod
    def _content_not_empty(cls, value: list[TextBlock]) -> list[TextBlock]:
        normalize_content(list(value))
        return value


ACCOMPANIED = ("user.message", "user.tool_result", "user.custom_tool_result")
"""The events a `system.message` may follow (it is context for the turn that takes them)."""


class TextRubricParams(TextRubric):
    content: str = Field(min_length=1, max_length=MAX_RUBRIC_CHARS)


class FileRubricParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["file"]
    file_id: str = Field(min_length=1, max_length=128)

    @field_validator("file_id")
    @classmethod
    def _resolved_by_the_api(cls, value: str) -> str:
        # The API resolves a file rubric to its text before the event reaches a session (gateway/file_rubrics.py);
        # one sent straight to the workflow has no file store to read, so it is refused with the way to send it.
        raise ValueError(
            f"file {value!r}: a file rubric is resolved to its text by the HTTP API; send this event "
            "through the API, or send the rubric as text"
        )


class UserDefineOutcomeParams(BaseModel):
    """An outcome to work toward: `description` is the task, `rubric` how a grader judges it, `max_iterations` the
    evaluate-then-revise cycles before giving up."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["user.define_outcome"]
    description: str = Field(min_length=1, max_length=MAX_RUBRIC_CHARS)
    rubric: Annotated[TextRubricParams | FileRubricParams, Field(discriminator="type")]
    max_iterations: int | None = Field(default=None, ge=1, le=MAX_OUTCOME_ITERATIONS)
    id: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("description")
    @classmethod
    def _description_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("description must not be blank")
        return value


UserEventParams = Annotated[
    UserMessageParams
    | UserInterruptParams
    | UserToolConfirmationParams
    | UserCustomToolResultParams
    | UserToolResultParams
    | UserDefineOutcomeParams
    | SystemMessageParams,
    Field(discriminator="type"),
]


class SendEventsInput(SendableInput):
    """Input of the `send_events` update. Events are validated by the update's validator, so a malformed
    event is rejected with a readable message instead of failing to decode."""

    events: list[dict[str, Any]]
    answer_events: bool = False
    """True: the answer carries the events written too (`SendEventsResult.events`: what the gateway shows the
    sender, with no query to read them back). False, the default: the ids alone, so that the answer, which history
    keeps beside the update's input, does not hold every event twice, and a client without corral's converter can
    decode it however large the events were (a large one is kept in the blob store)."""


_USER_EVENTS: TypeAdapter[list[UserEventParams]] = TypeAdapter(list[UserEventParams])


def parse_user_events(input: SendEventsInput) -> list[UserEventParams]:
    """Validate a `send_events` batch; raise ValueError with a message a person can act on."""
    if not input.events:
        raise ValueError("events: send at least one event")
    if len(input.events) > MAX_EVENTS_PER_BATCH:
        raise ValueError(f"events: at most {MAX_EVENTS_PER_BATCH} events per batch, got {len(input.events)}")
    try:
        params = _USER_EVENTS.validate_python(input.events)
    except ValidationError as exc:
        raise ValueError(readable_validation_error(exc, prefix="events")) from None
    check_system_message(params)
    total = 0
    for index, param in enumerate(params):
        total += len(param.model_dump_json())
        if total > MAX_MESSAGE_BYTES:
            raise ValueError(
                f"events[{index}]: the batch is {total} bytes up to here, over the limit of {MAX_MESSAGE_BYTES} bytes"
            )
    return params


def check_system_message(params: list[UserEventParams]) -> None:
    """At most one `system.message` per batch, last, right after the event it accompanies (the API's rule)."""
    at = [index for index, param in enumerate(params) if isinstance(param, SystemMessageParams)]
    if not at:
        return
    index = at[-1]
    rule = f"a system.message comes last in its batch, right after the {' or '.join(ACCOMPANIED)} it accompanies"
    if len(at) > 1:
        raise ValueError(f"events[{index}]: at most one system.message per batch ({rule})")
    if index != len(params) - 1:
        raise ValueError(f"events[{index}]: {rule}; it is followed by {params[index + 1].type}")
    if index == 0 or params[index - 1].type not in ACCOMPANIED:
        after = f"follows {params[index - 1].type}" if index else "is alone"
        raise ValueError(f"events[{index}]: {rule}; here it {after}")


def readable_validation_error(exc: ValidationError, prefix: str) -> str:
    """One line per problem, e.g. `events[0].type: Input tag 'user.foo' found ... does not match ...`."""
    lines = []
    for error in exc.errors(include_url=False):
        location = prefix + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
        lines.append(f"{location}: {error['msg']}")
    return "; ".join(_unique(lines))


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)

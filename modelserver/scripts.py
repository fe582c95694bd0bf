"""Deterministic scripts for the offline model server: models, bookkeeping and response planning.

Everything here is pure logic (no I/O) so the server's behaviour can be unit-tested without HTTP.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.contract.context import SUMMARIZER_SYSTEM, SUMMARY_REQUEST
from modelserver.gates import RepeatUntil, echoed_matches, step_position
from modelserver.grading import grader_cycle, is_grader_request

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"]

SCRIPT_MODEL_PREFIX = "script:"
REFUSAL_EXPLANATION = "The scripted model declined this request."


class ToolUseSpec(BaseModel):
    """One tool call a script step makes, so tests can drive an agent's tool loop exactly."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class FailureSpec(BaseModel):
    """One HTTP failure a step returns before succeeding, so retry paths can be exercised."""

    model_config = ConfigDict(extra="forbid")

    status: int = Field(default=529, ge=400, le=599)
    type: str = "overloaded_error"
    message: str | None = None
    retry_after: float | None = Field(default=None, ge=0)


StreamBreakKind = Literal["cut", "end", "malformed", "stall"]


class StreamBreak(BaseModel):
    """How one streamed answer breaks partway, so a client's handling of a broken stream can be exercised.

    After `after_deltas` content deltas: `cut` drops the connection (no end of the chunked body), `end` ends the body
    cleanly but without `message_delta` and `message_stop`, `malformed` sends a data line that is not JSON and then
    goes on, and `stall` sends nothing more until the client goes away.
    """

    model_config = ConfigDict(extra="forbid")

    kind: StreamBreakKind
    after_deltas: int = Field(default=1, ge=0)


class ScriptStep(BaseModel):
    """What the stand-in model answers on one turn; extra keys are rejected so typos surface early."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    tool_uses: list[ToolUseSpec] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    refusal_category: str | None = None
    """With stop_reason `refusal`: the `stop_details.category` the response carries (its explanation is fixed)."""
    fail: list[FailureSpec] = Field(default_factory=list)
    fail_mid_stream: bool = False
    break_stream: list[StreamBreak] = Field(default_factory=list)
    """One per use after the `fail` list, in order, like `fail` (a non-streaming request gets an overloaded error
    instead)."""
    first_token_latency: float | None = Field(default=None, ge=0)
    tokens_per_second: float | None = Field(default=None, ge=0)
    pace_hits: int | None = Field(default=None, ge=0)
    """Apply this step's pacing only to its first `pace_hits` uses (e.g. slow once, to interrupt it)."""
    echo_last_user: bool = False
    echo_matches: str | None = None  # a regex: its matches in the user messages are added, one a line (gates.py)
    repeat_until: RepeatUntil | None = None
    """Play this step on every request until the user messages match enough (a coordinator's waits, gates.py)."""

    @model_validator(mode="after")
    def _one_break_per_use(self) -> ScriptStep:
        if self.fail_mid_stream and self.break_stream:
            raise ValueError("fail_mid_stream and break_stream both break the first use: use break_stream only")
        return self


class Script(BaseModel):
    """An ordered list of steps, selected by how many assistant turns the request already contains."""

    model_config = ConfigDict(extra="forbid")

    steps: list[ScriptStep] = Field(min_length=1)
    loop: bool = False
    max_input_tokens: int = Field(default=200_000, ge=1)
    """The model's input window: a longer prompt gets the real API's 400 "prompt is too long"."""
    grader: list[ScriptStep] = Field(default_factory=list)
    """What an outcome's grader is answered, by evaluation cycle (the last repeats); unset, it plays `steps`."""


@dataclass(frozen=True)
class TextBlock:
    """A planned text content block."""

    text: str


@dataclass(frozen=True)
class ToolUseBlock:
    """A planned tool_use content block."""

    id: str
    name: str
    input: dict[str, Any]


PlannedBlock = TextBlock | ToolUseBlock


@dataclass(frozen=True)
class Plan:
    """A fully decided response; the HTTP layer only has to encode and pace it."""

    blocks: list[PlannedBlock]
    stop_reason: str
    input_tokens: int
    output_tokens: int
    first_token_latency: float | None = None
    tokens_per_second: float | None = None
    fail_mid_stream: bool = False
    stream_break: StreamBreak | None = None
    cache_read_input_tokens: int = 0
    stop_details: dict[str, Any] | None = None
    cache_creation_input_tokens: int = 0


@dataclass(frozen=True)
class ApiError:
    """An Anthropic-shaped error the server should return instead of a message."""

    status: int
    type: str
    message: str
    retry_after: float | None = None

    def body(self) -> dict[str, Any]:
        """The JSON body the real API uses for errors."""
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


DEFAULT_FAILURE_MESSAGES = {
    "overloaded_error": "Overloaded (scripted failure from the corral offline stand-in)",
    "rate_limit_error": "Rate limited (scripted failure from the corral offline stand-in)",
    "api_error": "Internal server error (scripted failure from the corral offline stand-in)",
}


def content_to_dict(block: PlannedBlock) -> dict[str, Any]:
    """The Messages API JSON for one planned block."""
    if isinstance(block, TextBlock):
        return {"type": "text", "text": block.text}
    return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """Roughly four characters per token over messages, system and tools; deterministic, at least 1."""
    payload = [body.get("messages"), body.get("system"), body.get("tools")]
    return max(1, len(json.dumps(payload, sort_keys=True, separators=(",", ":"))) // 4)


def prompt_too_long(body: dict[str, Any], max_input_tokens: int) -> ApiError | None:
    """The real API's answer to a prompt over the model's input window, or None."""
    tokens = estimate_input_tokens(body)
    if tokens <= max_input_tokens:
        return None
    return ApiError(400, "invalid_request_error", f"prompt is too long: {tokens} tokens > {max_input_tokens} maximum")


def estimate_output_tokens(blocks: list[PlannedBlock]) -> int:
    """Roughly four characters per token over the generated output; at least 1."""
    chars = 0
    for block in blocks:
        if isinstance(block, TextBlock):
            chars += len(block.text)
        else:
            chars += len(block.name) + len(json.dumps(block.input, separators=(",", ":")))
    return max(1, chars // 4)


def split_text_tokens(text: str) -> list[str]:
    """Word-ish streaming chunks (a word plus its trailing whitespace) that concatenate back to text."""
    return re.findall(r"\s+|\S+\s*", text)


def split_json_pieces(value: dict[str, Any], size: int = 12) -> list[str]:
    """Fixed-size pieces of the JSON encoding, as the API streams tool input via partial_json."""
    encoded = json.dumps(value, separators=(",", ":"))
    return [encoded[i : i + size] for i in range(0, len(encoded), size)]


def block_text(content: Any) -> str:
    """Plain text of a message's content, including nested tool_result contents."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif block.get("type") == "tool_result":
                parts.append(block_text(block.get("content", "")))
    return "\n".join(p for p in parts if p)


def last_user_message(body: dict[str, Any]) -> dict[str, Any] | None:
    """The last message with role user, or None."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message
    return None


def user_text(messages: list[dict[str, Any]]) -> str:
    """The text of every user message (text blocks and tool results), one block a line."""
    users = (m for m in messages if isinstance(m, dict) and m.get("role") == "user")
    return "\n".join(filter(None, (block_text(m.get("content")) for m in users)))


def default_tool_use_id(script_name: str, step_index: int, position: int) -> str:
    """A stable tool_use id so replays and retries produce identical ids."""
    digest = hashlib.sha256(f"{script_name}\x00{step_index}\x00{position}".encode()).hexdigest()
    return f"toolu_{digest[:24]}"


def script_name_of(model: str) -> str | None:
    """The script name if the model asks for one (`script:NAME`), else None."""
    if model.startswith(SCRIPT_MODEL_PREFIX):
        return model[len(SCRIPT_MODEL_PREFIX) :]
    return None


def step_index_for(body: dict[str, Any], name: str, script: Script) -> int | ApiError:
    """Pick the step from the assistant messages (a repeated step takes several), wrapping for looping scripts."""
    index = step_position(body.get("messages") or [], [s.repeat_until for s in script.steps], script.loop, user_text)
    if script.loop:
        return index % len(script.steps)
    if index >= len(script.steps):
        steps = len(script.steps)
        return ApiError(400, "invalid_request_error", f"script {name} has {steps} steps; this request is step {index}")
    return index


def is_summary_request(body: dict[str, Any]) -> bool:
    """corral's compaction asks for a summary with its summariser's system prompt."""
    system = body.get("system")
    text = system if isinstance(system, str) else " ".join(str(b.get("text", "")) for b in system or [])
    return text.startswith(SUMMARIZER_SYSTEM)


def plan_summary(body: dict[str, Any]) -> Plan:
    """A deterministic summary, for any model: what each user message asked (its first words), in order. It does
    not take a script step: a summary is not a turn of the conversation."""
    asked = []
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            text = str(block.get("text", "")) if block.get("type") == "text" else ""
            if text and text != SUMMARY_REQUEST and not text.startswith("[A summary of the conversation"):
                asked.append(" ".join(text.split()[:6]))
            elif text.startswith("[A summary of the conversation"):
                asked.append("(an earlier summary)")
    blocks: list[PlannedBlock] = [
        TextBlock(f"[offline stand-in summary] The user asked, in order: {'; '.join(asked)}.")
    ]
    return Plan(blocks, "end_turn", estimate_input_tokens(body), estimate_output_tokens(blocks))


def plan_step(body: dict[str, Any], name: str, step_index: int, step: ScriptStep, hit: int) -> Plan | ApiError:
    """Turn a request and a script step (on its `hit`-th use, from 0) into a response plan or an error."""
    if hit < len(step.fail):
        failure = step.fail[hit]
        message = failure.message or DEFAULT_FAILURE_MESSAGES.get(
            failure.type, f"{failure.type} (scripted failure from the corral offline stand-in)"
        )
        return ApiError(failure.status, failure.type, message, failure.retry_after)

    said = [step.text or ""]
    if step.echo_last_user:
        last = last_user_message(body)
        said.append(block_text(last.get("content")) if last else "")
    if step.echo_matches is not None:
        said.append(echoed_matches(step.echo_matches, user_text(body.get("messages") or [])))
    text = "\n".join(part for part in said if part)

    blocks: list[PlannedBlock] = []
    if text:
        blocks.append(TextBlock(text))
    for position, tool in enumerate(step.tool_uses):
        tool_id = tool.id or default_tool_use_id(name, step_index, position)
        blocks.append(ToolUseBlock(tool_id, tool.name, dict(tool.input)))

    stop_reason = step.stop_reason or ("tool_use" if step.tool_uses else "end_turn")
    use = hit - len(step.fail)
    paced = step.pace_hits is None or use < step.pace_hits
    return Plan(
        blocks=blocks,
        stop_reason=stop_reason,
        input_tokens=estimate_input_tokens(body),
        output_tokens=estimate_output_tokens(blocks),
        first_token_latency=step.first_token_latency if paced else None,
        tokens_per_second=step.tokens_per_second if paced else None,
        fail_mid_stream=step.fail_mid_stream and use == 0,
        stream_break=step.break_stream[use] if use < len(step.break_stream) else None,
        stop_details=(
            {"type": "refusal", "category": step.refusal_category, "explanation": REFUSAL_EXPLANATION}
            if stop_reason == "refusal"
            else None
        ),
    )


@dataclass
class ScriptBook:
    """Registered scripts, per-(script, step) hit counters and a log of received requests; thread-safe."""

    scripts: dict[str, Script] = field(default_factory=dict)
    hits: dict[tuple[str, int], int] = field(default_factory=dict)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, name: str, script: Script) -> None:
        """Add or replace a script, resetting its counters and request log."""
        with self._lock:
            self.scripts[name] = script
            self.hits = {k: v for k, v in self.hits.items() if k[0] != name}
            self.requests[name] = []

    def delete(self, name: str) -> bool:
        """Forget a script; returns whether it existed."""
        with self._lock:
            self.hits = {k: v for k, v in self.hits.items() if k[0] != name}
            self.requests.pop(name, None)
            return self.scripts.pop(name, None) is not None

    def get(self, name: str) -> Script | None:
        """The script registered under name, if any."""
        with self._lock:
            return self.scripts.get(name)

    def names(self) -> list[str]:
        """Registered script names, sorted."""
        with self._lock:
            return sorted(self.scripts)

    def requests_for(self, name: str) -> list[dict[str, Any]] | None:
        """A copy of the request log for a script, or None if it is unknown."""
        with self._lock:
            if name not in self.scripts:
                return None
            return list(self.requests.get(name, []))

    def play(self, name: str, body: dict[str, Any], auth: str) -> Plan | ApiError:
        """Log the request, choose the step, count the hit and plan the response."""
        with self._lock:
            script = self.scripts.get(name)
            if script is None:
                return ApiError(404, "not_found_error", f"no script named {name!r} is registered with the corral "
                                f"offline model server; register it with PUT /_corral/scripts/{name}")  # fmt: skip
            summary = is_summary_request(body)
            grading = bool(script.grader) and is_grader_request(body)
            index = None if summary else grader_cycle(body) if grading else step_index_for(body, name, script)
            self.requests.setdefault(name, []).append(
                {"auth": auth, "step": index if isinstance(index, int) else None, "body": body}
            )
            too_long = prompt_too_long(body, script.max_input_tokens)
            if too_long is not None:
                return too_long
            if summary or index is None:
                return plan_summary(body)
            if isinstance(index, ApiError):
                return index
            if grading:
                index = min(index, len(script.grader) - 1)
            key = (name, -1 - index if grading else index)
            hit = self.hits[key] = self.hits.get(key, -1) + 1
            step = script.grader[index] if grading else script.steps[index]
        return plan_step(body, name, index, step, hit)

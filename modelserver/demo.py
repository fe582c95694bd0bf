"""Demo behaviour of the offline stand-in: deterministic, honest replies that still exercise an agent loop.

Pure logic so it is reproducible and testable; it never pretends to be a real model.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from corral.contract.outcomes import GRADER_TOOL
from modelserver.gates import RepeatUntil
from modelserver.grading import is_grader_request
from modelserver.scripts import (
    Plan,
    PlannedBlock,
    Script,
    ScriptStep,
    TextBlock,
    ToolUseBlock,
    ToolUseSpec,
    block_text,
    estimate_input_tokens,
    estimate_output_tokens,
)

MARKER = "[offline stand-in model] "
_TRANSCRIPT = re.compile(r"<transcript>\n(.*?)\n</transcript>", flags=re.DOTALL)
VERDICT_PREVIEW_CHARS = 200
RESULT_PREVIEW_CHARS = 300
ECHO_CHARS = 200
_EDGE_PUNCTUATION = " \t\r\n.,;:!?\"'`"
_TYPE_DEFAULTS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
    "null": None,
}


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict)]


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in body.get("tools") or [] if isinstance(t, dict) and isinstance(t.get("name"), str)]


def _tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def _tool_names_by_id(messages: list[dict[str, Any]], before: int) -> dict[str, str]:
    """Map tool_use ids to tool names from the assistant message preceding index `before`."""
    for message in reversed(messages[:before]):
        if message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            return {}
        return {
            str(b.get("id")): str(b.get("name")) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
        }
    return {}


def _summarise_results(messages: list[dict[str, Any]], index: int) -> str:
    names = _tool_names_by_id(messages, index)
    lines = []
    for result in _tool_results(messages[index]):
        name = names.get(str(result.get("tool_use_id")), "an unknown tool")
        text = block_text(result.get("content", ""))[:RESULT_PREVIEW_CHARS]
        error = " (reported as an error)" if result.get("is_error") else ""
        lines.append(f"Tool result for {name}{error}: {text}")
    return "\n".join(lines)


def _mentioned_tool(text: str, tools: list[dict[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """The tool whose name appears earliest in text (whole-word, case-insensitive) and the text after it."""
    best: tuple[int, dict[str, Any], str] | None = None
    for tool in tools:
        pattern = rf"(?<![A-Za-z0-9_]){re.escape(tool['name'])}(?![A-Za-z0-9_])"
        match = re.search(pattern, text, flags=re.IGNORECASE)
        if match and (best is None or match.start() < best[0]):
            best = (match.start(), tool, _argument(text, match.start(), match.end()))
    return (best[1], best[2]) if best else None


_CLAUSE_END = re.compile(r"\s+(?:and|then)\s+|[,;]\s|[.!?](?:\s|$)", flags=re.IGNORECASE)


def _argument(text: str, start: int, end: int) -> str:
    """The clause after the tool's name ("calculate 6*7 and then ..." -> "6*7"); when nothing follows it,
    the sentence before it ("what is 2**10? use calculate" -> "what is 2**10")."""
    after = _CLAUSE_END.split(text[end:].strip(), maxsplit=1)[0].strip(_EDGE_PUNCTUATION)
    if after:
        return after
    for part in reversed(re.split(r"[.!?;]\s", text[:start].strip())):
        part = _FILLER.sub("", part.strip()).strip(_EDGE_PUNCTUATION)
        if part:
            return part
    return ""


_FILLER = re.compile(r"(?:\b(?:please|use|call|run|with|the|tool|and|then|now)\b\s*)+$", flags=re.IGNORECASE)


def _default_for(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    default = _TYPE_DEFAULTS.get(kind) if isinstance(kind, str) else None
    return default.copy() if isinstance(default, list | dict) else default


def named_arguments(text: str, tool: str, schema: Any) -> dict[str, Any] | None:
    """`edit file_path=README.md old_string="a b" new_string=c`: every word after the tool's name is a
    `property=value` pair of its schema (shell quoting allowed); None when the text is not of that form."""
    match = re.search(rf"(?<![A-Za-z0-9_]){re.escape(tool)}(?![A-Za-z0-9_])", text, flags=re.IGNORECASE)
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    if match is None or not isinstance(properties, dict):
        return None
    try:
        words = shlex.split(text[match.end() :])
    except ValueError:
        return None
    pairs = [word.partition("=") for word in words]
    if not pairs or any(not sep or key not in properties for key, sep, _ in pairs):
        return None
    result: dict[str, Any] = {}
    for key, _, value in pairs:
        kind = properties[key].get("type") if isinstance(properties[key], dict) else None
        result[key] = (
            int(value)
            if kind == "integer" and value.lstrip("-").isdigit()
            else (value.lower() == "true" if kind == "boolean" else value)
        )
    return result


def build_tool_input(schema: Any, argument: str) -> dict[str, Any]:
    """Fill a tool's input: the user's words go to the first (required) string property; rest get defaults."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]

    def is_string(prop: str) -> bool:
        spec = properties.get(prop)
        return isinstance(spec, dict) and spec.get("type") == "string" and "enum" not in spec

    target = next((r for r in required if is_string(r)), None) or next((p for p in properties if is_string(p)), None)
    result: dict[str, Any] = {}
    for prop in required:
        if prop != target:
            result[prop] = _default_for(properties.get(prop))
    if target is not None:
        result[target] = argument
    return result


def _demo_tool_use_id(body: dict[str, Any], name: str) -> str:
    digest = hashlib.sha256(f"demo\x00{len(_messages(body))}\x00{name}".encode()).hexdigest()
    return f"toolu_{digest[:24]}"


def plan_demo(body: dict[str, Any]) -> Plan:
    """Decide the demo reply for a request whose model is not a `script:` name."""
    if is_grader_request(body):
        return plan_verdict(body)
    messages = _messages(body)
    tools = _tools(body)
    last_index = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), None)
    blocks: list[PlannedBlock]

    if last_index is not None and _tool_results(messages[last_index]):
        blocks = [TextBlock(MARKER + _summarise_results(messages, last_index))]
        stop_reason = "end_turn"
    else:
        user_text = block_text(messages[last_index].get("content")) if last_index is not None else ""
        mention = _mentioned_tool(user_text, tools)
        if mention is not None:
            tool, argument = mention
            name = tool["name"]
            named = named_arguments(user_text, name, tool.get("input_schema"))
            tool_input = named if named is not None else build_tool_input(tool.get("input_schema"), argument)
            blocks = [
                TextBlock(f"{MARKER}Calling {name}."),
                ToolUseBlock(_demo_tool_use_id(body, name), name, tool_input),
            ]
            stop_reason = "tool_use"
        else:
            said = user_text.strip()[:ECHO_CHARS]
            text = (
                f"{MARKER}I am corral's offline stand-in, not a real model: "
                "set ANTHROPIC_API_KEY to talk to Claude. "
                f'You said: "{said}".'
            )
            if tools:
                text += " Ask me to use one of: " + ", ".join(t["name"] for t in tools) + "."
            else:
                text += " No tools were offered, so I can only echo."
            blocks = [TextBlock(text)]
            stop_reason = "end_turn"

    return Plan(
        blocks=blocks,
        stop_reason=stop_reason,
        input_tokens=estimate_input_tokens(body),
        output_tokens=estimate_output_tokens(blocks),
    )


def _first_user_text(body: dict[str, Any]) -> str:
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def transcript_of(body: dict[str, Any]) -> str:
    """The transcript of the agent's work in a grader's prompt (corral.contract.outcomes.grader_prompt)."""
    match = _TRANSCRIPT.search(_first_user_text(body))
    return match.group(1) if match else ""


def plan_verdict(body: dict[str, Any]) -> Plan:
    """The default model's verdict: `satisfied` when the transcript shows the agent's work, its messages or calls
    (the stand-in cannot judge it against the rubric, and says so), `needs_revision` when it shows none; always
    through an `outcome_verdict` call."""
    work = [line for line in transcript_of(body).splitlines() if line.startswith("agent")]  # messages and calls
    if work:
        last = " ".join(work[-1].split())[:VERDICT_PREVIEW_CHARS]
        shown = f'{len(work)} line{"s" if len(work) > 1 else ""}, the last: "{last}"'
        verdict = {
            "result": "satisfied",
            "explanation": f"{MARKER}The transcript shows the agent's work ({shown}). The stand-in is not a real "
            "model and cannot judge the work against the rubric, so it accepts it.",
        }
    else:
        verdict = {
            "result": "needs_revision",
            "explanation": f"{MARKER}The transcript shows no work yet: produce what the outcome asks for, then end "
            "your turn.",
        }
    digest = hashlib.sha256(json.dumps(body.get("messages"), sort_keys=True).encode()).hexdigest()
    blocks: list[PlannedBlock] = [ToolUseBlock(f"toolu_{digest[:24]}", GRADER_TOOL, verdict)]
    return Plan(blocks, "tool_use", estimate_input_tokens(body), estimate_output_tokens(blocks))


# ---- the multi-agent part of `corral demo`: scripts of a coordinator and its two subagents ----------------------

THREAD_DEMO_REPLY = r"Message from thread sthr_\w+ \(([\w-]+)\):\n([^\n]*)"
"""A thread's reply as corral's context shows it to the coordinator; the groups are the agent's name and the first
line of its reply."""
THREAD_DEMO_SCRIPTS: dict[str, Script] = {
    "demo-coordinator": Script(
        steps=[
            ScriptStep(
                text=f"{MARKER}Asking two threads at once.",
                tool_uses=[
                    ToolUseSpec(name="spawn_thread", input={"agent": "shell", "message": "Which kernel runs here?"}),
                    ToolUseSpec(name="spawn_thread", input={"agent": "clock", "message": "What time is it?"}),
                ],
            ),
            # A wait returns at the first reply: wait again until both have replied.
            ScriptStep(
                tool_uses=[ToolUseSpec(name="wait_for_threads")],
                repeat_until=RepeatUntil(pattern=THREAD_DEMO_REPLY, count=2),
            ),
            ScriptStep(text=f"{MARKER}Both threads replied:", echo_matches=THREAD_DEMO_REPLY),
        ]
    ),
    "demo-shell": Script(
        steps=[
            ScriptStep(tool_uses=[ToolUseSpec(name="bash", input={"command": "uname -sr"})]),
            ScriptStep(echo_last_user=True),
        ]
    ),
    "demo-clock": Script(steps=[ScriptStep(tool_uses=[ToolUseSpec(name="get_time")]), ScriptStep(echo_last_user=True)]),
}
"""What the coordinator (`script:demo-coordinator`) and its subagents `shell` (`script:demo-shell`, bash in the
shared sandbox) and `clock` (`script:demo-clock`, the utility hand) answer, turn by turn, each on its own
conversation."""

"""Prompt caching: the model turn marks the stable prefix (tools, system prompt, the conversation so far), and the
offline model server accounts for cache reads the way the real API does, so the saving can be measured."""

from __future__ import annotations

from typing import Any

from corral.client import read_events, send_text
from corral.contract.events import SpanModelRequestEnd
from modelserver.cache import PromptCache
from tests.conftest import Stack, wait_for_idle


def _request(*texts: str, system: str = "be brief") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": t}]}
        for i, t in enumerate(texts)
    ]
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {"model": "m", "system": system, "messages": messages}


def test_a_read_is_the_longest_prefix_an_earlier_request_wrote() -> None:
    cache = PromptCache()
    first = cache.account(_request("a" * 400), total_tokens=200)
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 100
    second = cache.account(_request("a" * 400, "b" * 400, "c" * 400), total_tokens=400)
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens, "the first request's prefix"
    assert second.cache_creation_input_tokens > 150, "and it writes its own, longer one"
    assert second.input_tokens == 400 - second.cache_read_input_tokens - second.cache_creation_input_tokens
    other = cache.account(_request("a" * 400, system="be verbose"), total_tokens=200)
    assert other.cache_read_input_tokens == 0, "a different system prompt: a different prefix"
    unmarked = _request("a" * 400)
    del unmarked["messages"][-1]["content"][-1]["cache_control"]
    assert cache.account(unmarked, total_tokens=200).cache_read_input_tokens == 0, "no breakpoint, no read"


async def test_a_long_session_reads_its_prefix_from_the_cache(stack: Stack) -> None:
    model = stack.script([{"text": "Noted. " * 40}], loop=True)
    handle = await stack.start(model, agent={"model": model, "system": "You keep notes. " * 50})
    after = 0
    for turn in range(1, 9):
        await send_text(handle, f"note {turn}: " + "detail " * 60)
        after = (await wait_for_idle(handle, after=after))[-1].position
    usage = [e.model_usage for e in await _ends(handle)]
    assert usage[0].cache_read_input_tokens == 0 and usage[0].cache_creation_input_tokens > 0
    assert all(u.cache_read_input_tokens > 0 for u in usage[1:]), "every later turn reads the earlier prefix"
    last = usage[-1]
    share = last.cache_read_input_tokens / (
        last.cache_read_input_tokens + last.cache_creation_input_tokens + last.input_tokens
    )
    print(f"\ncache-read share of the last request's input: {share:.0%}")
    assert share >= 0.8
    session = await handle.query("session")
    assert session["usage"]["cache_read_input_tokens"] == sum(u.cache_read_input_tokens for u in usage)


async def _ends(handle: Any) -> list[SpanModelRequestEnd]:

    return [
        e for e in await read_events(handle, types=["span.model_request_end"]) if isinstance(e, SpanModelRequestEnd)
    ]

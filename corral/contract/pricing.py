"""List prices of models, and what a session's usage costs at them (what a session `budget` is measured in).

The table holds Anthropic's public list prices, in USD per million tokens, as they stood on `PRICES_AS_OF`
(platform.claude.com/docs/en/about-claude/pricing and the models' own pages): base input, output, cache reads
(hits and refreshes) and cache writes at the 5-minute rate, which is the only cache corral's requests ask for. They
are list prices, not what an account is billed (no batch, regional or negotiated rates), and they change: edit the
table (and its date) when they do. Models priced by prompt length (claude-haiku-5-5) or not priced publicly
(claude-mythos-preview) are left out, so a budget on them is refused rather than enforced at a wrong price.

A session with a budget should not depend on this table while it runs: whoever starts it copies the price in force
into `budget.price` (the gateway does; `CORRAL_MODEL_PRICES` may add or override prices there, e.g. for the offline
model server's `script:…` models in tests), so a later edit of the table never changes what a running session has
spent, nor how its history replays. Only a budget given with no price (plain JSON from the `temporal` CLI) is
measured at the table of the worker that runs it. Pure functions only: safe in workflow code.
"""

from __future__ import annotations

import json
import re
from decimal import ROUND_CEILING, Decimal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.contract.errors import NotBudgetable
from corral.contract.events import ModelUsage

PRICES_AS_OF = "2026-12-02"
PRICES_ENVIRONMENT_VARIABLE = "CORRAL_MODEL_PRICES"
"""JSON object `{model: {input, output, cache_read, cache_write}}` (USD per million tokens) read by the gateway:
prices for models the table lacks, or in place of its own."""


class ModelPrice(BaseModel):
    """A model's list price, in USD per million tokens (decimal strings in JSON, so no rounding creeps in)."""

    model_config = ConfigDict(extra="forbid")
    input: Decimal = Field(ge=0)
    output: Decimal = Field(ge=0)
    cache_read: Decimal = Field(ge=0)
    cache_write: Decimal = Field(ge=0)


def _price(input: str, output: str, cache_read: str, cache_write: str) -> ModelPrice:
    return ModelPrice(
        input=Decimal(input), output=Decimal(output), cache_read=Decimal(cache_read), cache_write=Decimal(cache_write)
    )


_FABLE_5_1 = _price("10", "50", "0.25", "12.50")
_FABLE_5 = _price("10", "50", "1", "12.50")
_OPUS_5 = _price("5", "25", "0.50", "6.25")
_OPUS_4 = _price("15", "75", "1.50", "18.75")
_SONNET_5 = _price("2", "10", "0.20", "2.50")
_SONNET_4 = _price("3", "15", "0.30", "3.75")

PRICES: dict[str, ModelPrice] = {
    "claude-fable-5-2": _FABLE_5_1,
    "claude-mythos-5-2": _FABLE_5_1,
    "claude-fable-5-1": _FABLE_5_1,
    "claude-mythos-5-1": _FABLE_5_1,
    "claude-fable-5": _FABLE_5,
    "claude-mythos-5": _FABLE_5,
    "claude-opus-5-5": _price("4", "20", "0.20", "5"),
    "claude-opus-5": _OPUS_5,
    "claude-opus-4-8": _OPUS_5,
    "claude-opus-4-7": _OPUS_5,
    "claude-opus-4-6": _OPUS_5,
    "claude-opus-4-5": _OPUS_5,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-opus-4": _OPUS_4,
    "claude-sonnet-5-5": _price("2", "10", "0.10", "2.50"),  # cache reads cut from $0.20 on 2026-10-07
    "claude-sonnet-5": _SONNET_5,
    "claude-sonnet-4-6": _SONNET_4,
    "claude-sonnet-4-5": _SONNET_4,
    "claude-sonnet-4-0": _SONNET_4,
    "claude-sonnet-4": _SONNET_4,
    "claude-haiku-4-5": _price("1", "5", "0.10", "1.25"),
}
"""List prices as of `PRICES_AS_OF`; a dated id (`claude-haiku-4-5-20251001`) has its alias's price."""

_DATED = re.compile(r"^(?P<alias>.+)-\d{8}$")
_MILLION = Decimal(1_000_000)
_CENTS = Decimal(100)


def price_of(model: str, extra: dict[str, ModelPrice] | None = None) -> ModelPrice | None:
    """The list price of `model` (`extra` first, then the table, a dated id as its alias), or None."""
    for table in (extra or {}, PRICES):
        if model in table:
            return table[model]
        dated = _DATED.match(model)
        if dated and dated["alias"] in table:
            return table[dated["alias"]]
    return None


def parse_prices(text: str | None) -> dict[str, ModelPrice]:
    """The prices of `CORRAL_MODEL_PRICES` (its text, or None when unset); a malformed value is an error."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return {str(model): ModelPrice.model_validate(price) for model, price in raw.items()}
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{PRICES_ENVIRONMENT_VARIABLE}: expected {{model: {{input, output, cache_read, "
                         f"cache_write}}}} in USD per million tokens: {exc}") from exc  # fmt: skip


def price_in_force(model: str, extra: dict[str, ModelPrice] | None = None) -> ModelPrice:
    """The price a budget on `model` is enforced at; `NotBudgetable` when it has none."""
    price = price_of(model, extra)
    if price is None:
        raise NotBudgetable(f"model {model!r} has no list price: a budget cannot be enforced")
    return price


def list_cost(model: str, usage: ModelUsage, price: ModelPrice | None = None) -> int:
    """What `usage` of `model` costs at list price (`price`, else the table's), in US cents, rounded up."""
    price = price or price_in_force(model)
    dollars = (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_input_tokens * price.cache_read
        + usage.cache_creation_input_tokens * price.cache_write
    ) / _MILLION
    return int((dollars * _CENTS).to_integral_value(rounding=ROUND_CEILING))

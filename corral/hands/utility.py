"""The utility hand: tools that need no sandbox and no credential (`get_time`, `calculate`)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from corral.hands._execute import ToolFunction

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 1000
MAX_EXPONENT = 10_000
MAX_RESULT_BITS = 14_000
"""No step may make an integer longer than this (about 4,200 decimal digits; Python prints none past 4,300), so that
`(9**9999)**9999` is refused before it is computed, not after minutes of the hand's event loop."""


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is too large (limit {MAX_EXPONENT})")
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and abs(left) > 1 and right > 0:
            _check_bits((abs(left).bit_length() - 1) * right)  # at least half the result: what passes is cheap
        result: int | float = _BINARY[type(node.op)](left, right)
        if isinstance(result, int):
            _check_bits(result.bit_length())
        return result
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        negated: int | float = _UNARY[type(node.op)](_evaluate(node.operand))
        return negated
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:80]}")


def _check_bits(bits: int | float) -> None:
    if bits > MAX_RESULT_BITS:
        raise ValueError(f"the result would be too large (more than {MAX_RESULT_BITS} bits)")


def calculate(input: dict[str, Any]) -> str:
    """Evaluate arithmetic safely: only numbers, + - * / // % ** and parentheses are allowed."""
    expression = input.get("expression")
    if not isinstance(expression, str) or not expression.strip():
        raise ValueError("input.expression must be a non-empty string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from exc
    return f"{expression.strip()} = {_evaluate(tree)}"


def get_time(input: dict[str, Any]) -> str:
    """The hand's current time in UTC."""
    return datetime.now(UTC).isoformat(timespec="seconds")


UTILITY_TOOLS: dict[str, ToolFunction] = {"get_time": get_time, "calculate": calculate}

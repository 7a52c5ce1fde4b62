"""The bundled models as a user meets them: `capscore models`, one name per thing, typos, test fixtures."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import open_clip
import pytest

from capscore.backbones import load_backbone
from capscore.backbones.registry import BUNDLED, PURPOSE, REBUILT
from capscore.cli import main
from capscore.errors import CapscoreError


def test_models_fits_100_columns_and_gives_each_bundled_model_its_purpose(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    for name in BUNDLED:
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert PURPOSE[name] in line  # one line each
    for name in REBUILT:
        assert f"{name} is no longer shipped" in out


def test_models_arch_wraps_every_architecture_name_within_100_columns(capsys):
    assert main(["models", "--arch"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 100
    listed = out.split("open_clip architectures", 1)[1].split(":", 1)[1].split()
    assert sorted(listed) == sorted(open_clip.list_models())


def test_a_bundled_name_that_is_also_an_architecture_is_that_architecture():
    """One name, one thing: `scenes-tiny-v4` (bundled) is trained weights of the architecture `scenes-tiny-v4`,
    and no architecture is named `scenes-tiny` (the bundled default is architecture scenes-tiny-v3)."""
    from capscore.scenes.tiny import BUNDLED_FILES, weights_arch

    import capscore.backbones.openclip  # noqa: F401  (registers capscore's architectures)

    archs = set(open_clip.list_models())
    assert "scenes-tiny" not in archs
    for name in BUNDLED:
        assert name not in archs or weights_arch(BUNDLED_FILES[name]) == name, name


@pytest.mark.parametrize("typo", ["scenes-tinyy", "scene-tiny", "scenes-tiny-v9"])
def test_a_typo_of_a_bundled_name_suggests_only_bundled_names(typo):
    with pytest.raises(CapscoreError) as e:
        load_backbone(typo)
    msg = str(e.value)
    assert msg.startswith(f"unknown bundled model {typo!r}; did you mean ")
    suggested = re.findall(r"'([^']+)'", msg.split("did you mean", 1)[1])
    assert suggested and set(suggested) <= set(BUNDLED), suggested


def test_an_unknown_architecture_still_gets_architecture_suggestions():
    with pytest.raises(CapscoreError, match=r"unknown open_clip architecture 'ViT-B-33'; did you mean 'ViT-B-32'"):
        load_backbone("ViT-B-33")


def test_the_test_fixture_architecture_is_not_registered_by_capscore(tmp_path):
    """capscore-test-tiny lives in tests/configs and only the tests (conftest) register it."""
    env = {k: v for k, v in os.environ.items() if k != "CAPSCORE_MODEL_CONFIGS"}
    code = ("import open_clip, capscore.backbones.openclip\n"
            "names = open_clip.list_models()\n"
            "print('capscore-test-tiny' in names, 'scenes-tiny-v1' in names)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["False", "True"]
    assert "capscore-test-tiny" in open_clip.list_models()  # registered here, by conftest

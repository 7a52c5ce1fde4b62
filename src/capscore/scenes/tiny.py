"""The bundled ``scenes-tiny`` models: small CLIPs trained on synthetic scenes (see ``MODEL_CARD.md``).

``load_backbone("scenes-tiny")`` lands here through ``capscore.backbones.registry.BUNDLED``. The weights
are fp16 safetensors files shipped in ``capscore/scenes/weights/``, cast to float32 on load (or the dtype
asked for); each names its open_clip architecture in its metadata (``arch``; a file without it is the v1
architecture ``scenes-tiny``), and the JSON beside it is its training report and claimed evaluation.

* ``scenes-tiny``: v3 (``backbones/configs/scenes-tiny-v3.json``: 96 px, convolutional stem, 8 px
  patches), trained with the single-object curriculum and image twins, then continued on crowded scenes
  (two stages, MODEL_CARD.md);
* ``scenes-tiny-v4``: v3's architecture with a second-order global read-out (the flattened mean outer
  product of the joint-space tokens, :mod:`capscore.backbones.readout`): stage 1 of v3, then a stage 2
  with that read-out. Its global cosine binds attributes to objects, which CLIP's class token does not;
  it is the model that meets the flip and retrieval targets of MODEL_CARD.md. ``scenes-tiny`` stays
  the default: a CLIP-like test bed whose global embedding does not bind, the premise of ABE-CLIP and
  of the LGIP probes, and the model every replication in docs/research/replications.md measured;

``scenes-tiny-v1``, the first model (64 px ViT, architecture ``scenes-tiny-v1``), is no longer shipped: its
recipe rebuilds it (the registry's ``REBUILT`` says how); a rebuilt file loads with
``--model openclip:scenes-tiny-v1/PATH``.
"""
from __future__ import annotations

from pathlib import Path
import json


from capscore.errors import CapscoreError

ARCH = "scenes-tiny-v1"  # the architecture of a weights file that does not name one (v1's)
WEIGHTS_DIR = Path(__file__).parent / "weights"
BUNDLED_FILES = {"scenes-tiny": WEIGHTS_DIR / "scenes-tiny.safetensors",
                 "scenes-tiny-v4": WEIGHTS_DIR / "scenes-tiny-v4.safetensors"}


def weights_arch(path: str | Path) -> str:
    """The open_clip architecture a bundled-format weights file names in its metadata (default v1's)."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415  (deferred: safetensors)

    try:
        with safe_open(str(path), "pt") as f:
            return (f.metadata() or {}).get("arch", ARCH)
    except (SafetensorError, OSError, ValueError) as e:
        raise CapscoreError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0][:120]})") from None


def backbone_from_file(path: str | Path, *, spec: str = ARCH, arch: str | None = None):
    """Build the open_clip architecture ``arch`` (default: the one the file's metadata names; with its
    convolutional stem where it has one, :mod:`capscore.backbones.convstem`) and load an fp16/fp32
    safetensors state dict into it (float32)."""
    import open_clip  # noqa: PLC0415  (deferred: open_clip)
    from safetensors.torch import load_file  # noqa: PLC0415  (deferred: safetensors)

    from capscore.backbones.openclip import OpenClipBackbone, _seeded_create  # noqa: PLC0415  (deferred: open_clip, torch); also registers capscore's configs
    from capscore.backbones.readout import readout_of  # noqa: PLC0415  (deferred: torch)

    path = Path(path)
    if not path.is_file():
        raise CapscoreError(f"{arch or ARCH} weights not found at {path}; reinstall capscore or train them with "
                            f"`capscore train scenes-tiny --out DIR` (then DIR/scenes-tiny.safetensors)")
    arch = arch or weights_arch(path)
    model, preprocess = _seeded_create(arch, pretrained=None, seed=0)  # the init is overwritten (open_clip kept quiet)
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "text.attn_mask" and not k.endswith("attn_mask")]
    if missing or unexpected:
        raise CapscoreError(f"{path}: not a {arch} state dict (missing {missing[:3]}, unexpected "
                            f"{unexpected[:3]})")
    return OpenClipBackbone(model.float(), preprocess, open_clip.get_tokenizer(arch), spec=spec,
                            readout=readout_of(arch))


def load_scenes_tiny(*, spec: str = "scenes-tiny", device: str = "cpu", dtype: str = "fp32", seed: int = 0,
                     context_length: int | None = None, weights: Path | None = None):
    """The registry entry point for the bundled model ``spec`` (a key of :data:`BUNDLED_FILES`).
    ``seed`` is ignored (trained weights); ``context_length`` must be 77 or None."""
    from capscore.backbones.base import resolve_dtype  # noqa: PLC0415  (deferred: torch)

    if context_length not in (None, 77):
        raise CapscoreError(f"{spec} has a 77-token context; got context_length={context_length}")
    weights = weights or BUNDLED_FILES[spec]
    return backbone_from_file(weights, spec=spec).to(device, resolve_dtype(dtype))


def input_size(model: str = "scenes-tiny") -> int:
    """The input size of bundled ``model``, read from its files (the architecture its weights name, that
    architecture's open_clip config), without building the model."""
    config = WEIGHTS_DIR.parents[1] / "backbones" / "configs" / f"{weights_arch(BUNDLED_FILES[model])}.json"
    return int(json.loads(config.read_text())["vision_cfg"]["image_size"])

"""One registry, one ``--model`` grammar, one loader.

Grammar (documented in the README):

=================================  ==========================================================
``scenes-tiny``                    capscore's bundled model (any name in ``BUNDLED``)
``ARCH/TAG``                       open_clip architecture + pretrained tag or local weights file
``ARCH``                           open_clip architecture with RANDOM weights (``seed``), warns
``openclip:ARCH[/TAG]``            the same, explicit
``ckpt:PATH`` / ``PATH.pt|.pth``   OpenAI-format checkpoint (CLIP, PAC-S, LongCLIP)
``hf:ID_OR_DIR``                   Hugging Face ``CLIPModel`` / ``SiglipModel``
``mclip:DIR``                      multilingual text student + CLIP image tower (M-CLIP / PR-MCS)
``fgclip:DIR``                     FG-CLIP checkpoint folder, mapped onto transformers' CLIPModel
``hf-hub:ORG/REPO``, ``local-dir:DIR``  passed to open_clip's own schemas
=================================  ==========================================================

Adapters are rows in ``ADAPTERS`` (prefix -> "module:function"), imported lazily,
so loading one family never imports another's heavy dependencies.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capscore.errors import CapscoreError, unknown_name
from capscore._table import format_table
from capscore._version import __version__
from capscore.backbones import lazy as lz
from capscore.backbones.offline import require_hf_repo, require_open_clip_weights

if TYPE_CHECKING:  # the registry itself imports no torch: argument checks stay cheap
    from capscore.backbones.base import Backbone


@dataclass(frozen=True)
class Adapter:
    prefix: str
    target: str  # "module:function"; function(rest, **opts) -> Backbone
    example: str
    description: str

    def load(self, rest: str, **opts) -> Backbone:
        module, func = self.target.split(":")
        return getattr(importlib.import_module(module), func)(rest, **opts)


ADAPTERS: dict[str, Adapter] = {
    a.prefix: a
    for a in [
        Adapter("openclip", "capscore.backbones.registry:_load_openclip_spec", "ViT-B-32/openai",
                "open_clip architecture with a pretrained tag, a weights file, or nothing (random init)"),
        Adapter("ckpt", "capscore.backbones.openai_ckpt:load_openai_checkpoint", "ckpt:pacs_vitb32.pth",
                "OpenAI-format state dict (.pt/.pth/.safetensors): CLIP, PAC-S, LongCLIP"),
        Adapter("hf", "capscore.backbones.hf:load_hf", "hf:openai/clip-vit-base-patch32",
                "Hugging Face transformers CLIPModel or SiglipModel (hub id or local folder)"),
        Adapter("mclip", "capscore.backbones.multilingual:load_multilingual", "mclip:./student",
                "multilingual text encoder + projection into a CLIP image tower's space"),
        Adapter("fgclip", "capscore.backbones.fgclip:load_fgclip", "fgclip:~/fg-clip-base",
                "FG-CLIP folder (no remote code): dense patch tokens; 248-token long path with --context-length 248"),
        Adapter("bundled", "capscore.backbones.registry:_load_bundled", "scenes-tiny",
                "models shipped inside capscore"),
    ]
}

# Bundled models: name -> "module:function" returning a Backbone. The wheel ships at most two weights files.
BUNDLED: dict[str, str] = {
    "scenes-tiny": "capscore.scenes.tiny:load_scenes_tiny",
    "scenes-tiny-v4": "capscore.scenes.tiny:load_scenes_tiny",
}
# What each bundled model is for, one line each (`capscore models`).
PURPOSE: dict[str, str] = {
    "scenes-tiny": "the offline model: an 8 M-parameter CLIP trained on synthetic scenes (96 px)",
    "scenes-tiny-v4": "scenes-tiny + a second-order global read-out that binds attributes to objects",
}
# Models that were bundled once and are now rebuilt by their training recipe: name -> how to get them.
REBUILT: dict[str, str] = {
    "scenes-tiny-v1": ("is no longer shipped with capscore; rebuild it with its recipe (the scenes-tiny recipe's "
                       "defaults, see the model card), then load the file it writes with "
                       "--model openclip:scenes-tiny-v1/DIR/scenes-tiny.safetensors"),
}

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def _load_bundled(name: str, **opts) -> Backbone:
    module, func = BUNDLED[name].split(":")
    return getattr(importlib.import_module(module), func)(**{**opts, "spec": name})  # opts may hold spec already


CONFIG_DIR = Path(__file__).parent / "configs"  # capscore's own open_clip architectures (see openclip.py)


def known_architectures() -> list[str] | None:
    """open_clip's architecture names (its ``model_configs/*.json`` and capscore's), read from the
    files without importing open_clip (which imports torch and transformers); None if it is not installed.
    ``open_clip.list_models()`` returns the same names; once open_clip is imported, that list is used
    (it also holds configs added with ``open_clip.add_model_config`` at run time)."""
    if "open_clip" in sys.modules:  # already paid for: its list also has configs added at run time
        import capscore.backbones.openclip  # noqa: F401, PLC0415  (deferred: numpy, open_clip, torch; registers capscore's configs)

        return sorted(sys.modules["open_clip"].list_models())
    try:
        found = importlib.util.find_spec("open_clip")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None

    dirs = [Path(loc) / "model_configs" for loc in found.submodule_search_locations] + [CONFIG_DIR]
    names = {p.stem for d in dirs if d.is_dir() for p in d.glob("*.json")}
    for extra in filter(None, os.environ.get("CAPSCORE_MODEL_CONFIGS", "").split(os.pathsep)):  # as openclip.py
        path = Path(extra).expanduser()
        names |= {p.stem for p in path.glob("*.json")} if path.is_dir() else {path.stem} if path.suffix == ".json" else set()
    return sorted(names)


def _check_architecture(arch: str, known: list[str] | None, *, bare: bool = False) -> None:
    """``bare``: the whole spec is this one name (no tag, no prefix), so a near miss of a bundled model's
    name is a typo of that name and only bundled names are suggested."""
    if known is not None and arch not in known:
        if bare and difflib.get_close_matches(arch, list(BUNDLED), n=1, cutoff=0.8):
            raise unknown_name("bundled model", arch, BUNDLED)
        raise unknown_name("open_clip architecture", arch, known + list(BUNDLED))


def check_model_spec(spec: str) -> None:
    """The checks of :func:`load_backbone` that need no model: grammar and open_clip architecture name.

    Cheap (no torch, no open_clip import), so commands run it while parsing their arguments."""
    adapter, rest = parse_model_spec(spec)
    if adapter.prefix == "openclip" and not rest.startswith(("hf-hub:", "local-dir:")):
        _check_architecture(rest.partition("/")[0], known_architectures(), bare=spec == rest and "/" not in rest)


def _load_openclip_spec(rest: str, *, spec: str, trust_remote_code: bool = False, **opts) -> Backbone:
    if not rest.startswith(("hf-hub:", "local-dir:")):
        _check_architecture(rest.partition("/")[0], known_architectures(),  # before importing open_clip
                            bare=spec == rest and "/" not in rest)
    import open_clip  # noqa: PLC0415  (deferred: open_clip)

    from capscore.backbones.openclip import load_open_clip  # noqa: PLC0415  (deferred: numpy, open_clip, torch); also registers capscore's configs

    if rest.startswith(("hf-hub:", "local-dir:")):
        if rest.startswith("hf-hub:"):
            require_hf_repo(spec, rest[len("hf-hub:"):], ("open_clip_config.json",))  # fail fast offline
        return load_open_clip(rest, "schema", spec=spec, **opts)  # open_clip resolves the weights
    arch, _, tag = rest.partition("/")  # the architecture was checked above
    if tag:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        if tag not in tags and not Path(tag).expanduser().is_file():
            hint = unknown_name(f"pretrained tag for {arch}", tag, tags)
            raise CapscoreError(f"{hint} (or give a path to a weights file)")
        if tag in tags:
            require_open_clip_weights(spec, arch, tag)  # not cached and no network: one line, no minute of retries
    return load_open_clip(arch, tag or None, spec=spec, **opts)


def parse_model_spec(spec: str) -> tuple[Adapter, str]:
    """Split a ``--model`` string into (adapter, the adapter's part of the string)."""
    spec = spec.strip()
    if not spec:
        raise CapscoreError("empty --model; try 'scenes-tiny' or 'ViT-B-32/openai'")
    if spec in BUNDLED:
        return ADAPTERS["bundled"], spec
    if spec in REBUILT:
        raise CapscoreError(f"{spec} {REBUILT[spec]}")
    head, sep, rest = spec.partition(":")
    if sep and head in ADAPTERS and head != "bundled":
        return ADAPTERS[head], rest
    if spec.startswith(("hf-hub:", "local-dir:")):
        return ADAPTERS["openclip"], spec
    if spec.lower().endswith(CHECKPOINT_SUFFIXES) and not _is_openclip_arch(spec.split("/")[0]):
        return ADAPTERS["ckpt"], spec  # a bare path: OpenAI-format checkpoint
    return ADAPTERS["openclip"], spec


def _is_openclip_arch(name: str) -> bool:
    known = known_architectures()
    if known is not None:
        return name in known
    return False  # open_clip is not installed: no architecture names at all


def load_backbone(
    spec: str,
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    context_length: int | None = None,
    trust_remote_code: bool = False,
    rgb_order: str = "first",
    lazy: bool = False,
) -> Backbone:
    """Load any supported dual encoder from a ``--model`` string (see module docstring).

    ``rgb_order="after-crop"`` converts images to RGB after resize + crop, as the clipscore and
    pacscore reference scripts do (see :class:`~capscore.backbones.base.Backbone`); default ``"first"``.
    ``lazy=True``: when the same weights files were loaded before with the same recipe and code,
    return a :class:`~capscore.backbones.lazy.LazyBackbone` that builds the model only when a
    forward pass needs it (a run served from the embedding cache never does); see that module.
    """

    from capscore.backbones.base import resolve_device, resolve_dtype  # noqa: PLC0415  (deferred: numpy, torch)

    resolve_device(device)  # fail before loading any weights
    resolve_dtype(dtype)
    adapter, rest = parse_model_spec(spec)
    if lazy:
        files = weights_files(adapter, rest)
        key = None if not files or lz.env_disabled() else lz.facts_key(
            files, f"{spec}|{device}|{dtype}|seed={seed}|ctx={context_length}|rgb={rgb_order}|remote={trust_remote_code}")
        if key is not None:
            if adapter.prefix == "openclip":
                check_model_spec(spec)  # the checks a real load makes first
            build = lambda: load_backbone(  # noqa: E731
                spec, device=device, dtype=dtype, seed=seed, context_length=context_length,
                trust_remote_code=trust_remote_code, rgb_order=rgb_order)
            facts = lz.remembered(key)
            if facts is not None:
                return lz.LazyBackbone(facts, build, key)
            bb = build()
            lz.remember(key, bb)
            return bb
    opts = dict(spec=spec, device=device, dtype=dtype, seed=seed, context_length=context_length)
    if adapter.prefix in ("hf", "mclip"):
        opts["trust_remote_code"] = trust_remote_code
    bb = adapter.load(rest, **opts)
    if rgb_order != "first":
        bb.set_rgb_order(rgb_order)
    files = weights_files(adapter, rest)
    if files:
        bb.remember_weights_files(files, _recipe(bb, spec, dtype, context_length, seed))
    return bb


def weights_files(adapter: Adapter, rest: str) -> list[Path]:
    """The files a spec's weights are read from, where that is known without loading: the bundled
    models, ``ckpt:PATH`` and ``ARCH/PATH``. Empty for pretrained tags, hub ids and random init (their
    hash is computed from the parameters each run)."""
    if adapter.prefix == "bundled":  # capscore/scenes/weights/NAME.safetensors (capscore.scenes.tiny.BUNDLED_FILES)
        path = Path(__file__).resolve().parents[1] / "scenes" / "weights" / f"{rest}.safetensors"
        return [path] if path.is_file() else []
    if adapter.prefix == "ckpt":
        return [Path(rest.rpartition("#")[0] if "#" in rest else rest).expanduser()]
    if adapter.prefix == "openclip" and not rest.startswith(("hf-hub:", "local-dir:")):
        tag = rest.partition("/")[2]
        return [Path(tag).expanduser()] if tag and Path(tag).expanduser().is_file() else []
    return []


def _recipe(bb, spec: str, dtype: str, context_length: int | None, seed: int) -> str:
    """Everything besides the files that decides the loaded parameters (see capscore.backbones.hashcache)."""
    versions = [__version__] + [getattr(sys.modules.get(m), "__version__", "-") for m in ("torch", "open_clip")]
    return (f"{spec}|{dtype}|{bb.dtype}|ctx={context_length}/{bb.context_length}|seed={seed}"
            f"|readout={getattr(bb, 'readout', '-')}|{'/'.join(map(str, versions))}")


# The --model grammar as the user sees it: README's table and `capscore models` are both rendered from these
# rows (tests/test_cli_grammar.py checks the README copy), so the grammar is written once.
GRAMMAR: tuple[tuple[str, str, str], ...] = (
    ("`NAME`", "a model shipped with capscore (`capscore models` says what each is for)",
     "`scenes-tiny` (96 px), `scenes-tiny-v4` (scenes-tiny + second-order global)"),
    ("`ARCH/TAG`", "open_clip architecture + pretrained tag (or a local open_clip weights file)",
     "`ViT-B-32/openai`, `ViT-L-14/laion2b_s32b_b82k`"),
    ("`ARCH`", "open_clip architecture with **random** weights (`--seed`), warned", "`ViT-B-32`"),
    ("`ckpt:PATH` or bare `PATH.pt/.pth/.bin/.safetensors`",
     "OpenAI-format state dict: OpenAI CLIP fine-tunes, PAC-S, PAC++ (LoRA applied as pacscore's forward does), "
     "LongCLIP (248 tokens)",
     "`ckpt:~/pacs/clip_ViT-B-32.pth`, `ckpt:~/pacs/openClip_ViT-L-14.pth#arch=ViT-L-14`"),
    ("`hf:ID_OR_DIR`", "Hugging Face `CLIPModel` / `SiglipModel` (`--trust-remote-code` only if you pass it)",
     "`hf:openai/clip-vit-base-patch32`, `hf:google/siglip-base-patch16-224`"),
    ("`mclip:DIR`", "multilingual text student + CLIP image tower (M-CLIP / PR-MCS shape)",
     "`mclip:~/students/xlmr-vitb32`"),
    ("`fgclip:DIR`", "FG-CLIP folder (ABE-CLIP's headline backbone), no remote code; dense patch tokens",
     "`fgclip:~/fg-clip-base`"),
    ("`hf-hub:ORG/REPO`, `local-dir:DIR`", "open_clip's own schemas", "`hf-hub:timm/ViT-B-16-SigLIP`"),
)
GRAMMAR_HEADER = ("spec", "what loads", "example")


def grammar_markdown() -> str:
    """The README's ``--model`` table (Markdown)."""
    lines = ["| " + " | ".join(GRAMMAR_HEADER) + " |", "|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in GRAMMAR]
    return "\n".join(lines)


def describe_models(width: int = 100) -> str:
    """``capscore models``: the grammar (the README's rows, without Markdown marks), then each bundled
    model with its one-line purpose; every line fits in ``width`` columns."""
    plain = lambda text: text.replace("`", "").replace("**", "")  # noqa: E731
    wrap = lambda text, indent: textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent,  # noqa: E731
                                              break_on_hyphens=False, break_long_words=False)
    lines = []
    for spec, what, example in GRAMMAR:
        lines += [wrap(plain(spec), "  "), wrap(plain(what), "      "), wrap("e.g. " + plain(example), "      ")]
    bundled = format_table([{"bundled model": name, "purpose": PURPOSE[name]} for name in BUNDLED])
    rebuilt = [wrap(f"{name} {how}", "  ") for name, how in REBUILT.items()]
    return "\n".join(lines + ["", bundled, ""] + rebuilt)

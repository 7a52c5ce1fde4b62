"""Explain one word: ABE-CLIP's token–patch similarity map of a word of a caption over an image
(:func:`capscore.scores.abe.word_heatmap`), drawn with its top-K patches outlined
(:func:`capscore.report.explain.draw_heatmap`) into a PNG that ``capscore report`` reads back."""
from __future__ import annotations

from pathlib import Path

from capscore.errors import param_error
from capscore.report.explain import COLOR_RANGE, draw_heatmap
from capscore.backbones import load_backbone
from capscore.data.images import ImageRef
from capscore.embed import Encoder
from capscore.scores.abe import AbeConfig, word_heatmap


def explain_word(model: str, image: str | Path, caption: str, word: str, *, out: str | Path, refined: bool = False,
                 k: int = 5, pool: str | None = None, device: str = "cpu", dtype: str = "fp32", seed: int = 0,
                 color_range: tuple[float, float] = COLOR_RANGE):
    """Write the heat map of ``word`` to the PNG ``out`` -> the map (``.word``, ``.tokens``, ``.grid``).

    ``refined`` uses ABE's refined token t' instead of the token; ``k`` patches are outlined (ABE's K);
    ``pool`` is the concept pool file of the refinement (default: the bundled pool); ``color_range``
    is the cosine range of the colour scale, the same for every map so maps compare."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise param_error("out", "explain_word", "a .png file", str(out))
    if not color_range[0] < color_range[1]:
        raise param_error("color_range", "explain_word", "(low, high) with low < high", color_range)
    config = AbeConfig(k=k, pool=pool)
    encoder = Encoder(load_backbone(model, device=device, dtype=dtype, seed=seed))
    ref = ImageRef.of(image)
    heat = word_heatmap(encoder, ref, caption, word, config=config, refined=refined)
    _, picture = ref.load()
    about = {"model": model, "image": str(image), "caption": caption, "word": heat.word, "refined": heat.refined,
             "k": k, "max": float(heat.grid.max()), "min": float(heat.grid.min())}
    draw_heatmap(picture, heat, caption=caption, out=out, color_range=tuple(color_range), about=about)
    return heat

"""Zero-shot image classification with prompt templates (SPECS Table 4: ImageNet, CIFAR-10/100).

CLIP's protocol (Radford et al. 2021, sec. 3.1.4, and its prompt-engineering notebook):

1. for each class, every template is filled with the class name ("a photo of a {}.") and encoded;
2. the normalised template embeddings are **averaged, then re-normalised** -> one classifier row per
   class (the "prompt ensemble");
3. an image is assigned the classes in order of the cosine between its normalised embedding and
   the rows; top-1 / top-5 accuracy and the mean per-class (top-1) accuracy are reported in %.

Templates come from open_clip's shipped metadata (``open_clip.zero_shot_metadata``), used as a
library, not copied: ``openai`` = the 80 ImageNet templates of the CLIP paper, ``simple`` = the 7-template
subset open_clip also ships; ``single`` = the one prompt "a photo of a {}."; ``scenes`` = captions in the
style the synthetic scenes use (for ``scenes-zeroshot``). Ties: the true class must score strictly
higher than another class to rank above it (a tie counts against the image).

Inputs: an ImageNet-style folder (one sub-folder per class, images anywhere below it; labels are the
sub-folder names, sorted as torchvision's ImageFolder sorts them) or a CSV with ``path,label`` (``image``
is accepted for ``path``); class names from a text file (one per line, in sorted-label order, as
CLIP_benchmark's classnames files), a JSON object ``{label: name}``, ``imagenet`` (open_clip's 1,000
ImageNet class names, for the 1,000 WordNet-id folders or labels 0–999), or the labels themselves
(``_`` read as a space).
"""
from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from capscore.embed.engine import Encoder
from capscore.data.images import ImageRef
from capscore.errors import CapscoreError, InputError, unknown_name
from capscore.probes.run import ProbeResult

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
SINGLE_TEMPLATE = "a photo of a {}."


def _format(template: str) -> Callable[[str], str]:
    return lambda c: template.format(c)


def get_templates(name: str) -> tuple[Callable[[str], str], ...]:
    """A named template set: ``openai`` (80), ``simple`` (7), ``single`` (1) or ``scenes`` (3)."""
    if name in ("openai", "simple"):
        from open_clip import zero_shot_metadata as Z  # noqa: PLC0415  (deferred: open_clip)

        return tuple(Z.OPENAI_IMAGENET_TEMPLATES if name == "openai" else Z.SIMPLE_IMAGENET_TEMPLATES)
    if name == "single":
        return (_format(SINGLE_TEMPLATE),)
    if name == "scenes":
        # the scenes' own caption openings ("A picture of ...", "An image showing ...", "... on a grey
        # background."); class names for scenes carry their article ("a circle", "an orange object")
        return tuple(_format(t) for t in ("A picture of {}.", "An image showing {}.", "{} on a grey background."))
    raise unknown_name("template set", name, TEMPLATE_SETS)


TEMPLATE_SETS = ("openai", "simple", "single", "scenes")


# ============================================================================ pure metric
def class_ranks(logits: torch.Tensor | np.ndarray, labels: Sequence[int]) -> np.ndarray:
    """1-based rank of the true class per image: 1 + the number of other classes scoring ≥ it."""
    z = torch.as_tensor(np.asarray(logits, dtype=np.float64))
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    true = z.gather(1, y[:, None])  # (N, 1)
    return (z >= true).sum(dim=1).numpy()  # the true class counts itself once: the "1 +"


def accuracies(ranks: np.ndarray, labels: Sequence[int], n_classes: int) -> dict[str, float | None]:
    """top-1 / top-5 accuracy and mean per-class top-1 accuracy (over classes with images), in %.

    top-5 is ``None`` when there are 5 classes or fewer (every image would be a top-5 hit).
    """
    r, y = np.asarray(ranks), np.asarray(labels)
    if r.size == 0:
        raise CapscoreError("zero-shot classification needs at least one image")
    per_class = [100.0 * float((r[y == c] <= 1).mean()) for c in range(n_classes) if (y == c).any()]
    return {"top1": 100.0 * float((r <= 1).mean()),
            "top5": 100.0 * float((r <= 5).mean()) if n_classes > 5 else None,
            "mean_per_class": float(np.mean(per_class)), "n_classes_with_images": len(per_class)}


def classifier(encoder: Encoder, classnames: Sequence[str], templates: Sequence[Callable[[str], str]]) -> torch.Tensor:
    """(C, D): per class, the mean of its normalised template embeddings, re-normalised (CLIP)."""
    texts = [t(c) for c in classnames for t in templates]
    emb = encoder.encode_texts(texts).reshape(len(classnames), len(templates), -1)  # (C, T, D), rows normalised
    return F.normalize(emb.mean(dim=1), dim=-1)


# ============================================================================ data
@dataclass(frozen=True)
class ClassificationSet:
    images: tuple[ImageRef, ...]
    names: tuple[str, ...]  # per image, for rows
    labels: tuple[int, ...]  # index into classnames
    classnames: tuple[str, ...]
    info: dict = field(default_factory=dict)


def _read_classnames(spec: str | None, labels: list[str]) -> tuple[list[str], list[str]]:
    """-> (class labels in order, class names). ``labels`` = the sorted labels found in the data."""
    if spec is None:
        if all(lab.isdigit() for lab in labels):  # "a photo of a 3." is never what was meant
            raise CapscoreError("the labels are numbers; pass --classnames (a .txt, a .json {label: name}, "
                                "or imagenet) so the prompts name the classes")
        return labels, [lab.replace("_", " ") for lab in labels]
    if spec == "imagenet":
        from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES as names  # noqa: PLC0415  (deferred: open_clip)

        if all(lab.isdigit() for lab in labels):
            order = [str(i) for i in range(len(names))]
            bad = [lab for lab in labels if int(lab) >= len(names)]
            if bad:
                raise CapscoreError(f"--classnames imagenet: label {bad[0]} is not in 0..{len(names) - 1}")
            return order, list(names)
        if len(labels) != len(names):
            raise CapscoreError(f"--classnames imagenet needs the {len(names)} ImageNet class folders (sorted "
                                f"WordNet ids) or labels 0..{len(names) - 1}; found {len(labels)} labels")
        return labels, list(names)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InputError(str(path), "class-names file not found", expected="a .txt (one name per line), "
                                                                          "a .json {label: name}, or 'imagenet'")
    if path.suffix.lower() == ".json":
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{e.lineno}", f"malformed JSON ({e.msg})") from None
        if not isinstance(m, dict) or not all(isinstance(v, str) and v.strip() for v in m.values()):
            raise InputError(str(path), "not a JSON object of label -> class name")
        return [str(k) for k in m], [v.strip() for v in m.values()]
    lines = [(i, x.strip()) for i, x in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)]
    names = [x for _, x in lines if x]
    if len(names) != len(labels):
        raise InputError(str(path), f"{len(names)} class names for {len(labels)} labels in the data",
                         expected="one name per line, in sorted-label order")
    return labels, names


def load_classification(data: str | Path, images: str | Path | None = None, *,
                        classnames: str | None = None) -> ClassificationSet:
    """An ImageNet-style folder or a ``path,label`` CSV, plus class names (see the module docstring)."""
    data = Path(data).expanduser()
    refs, names, raw = [], [], []
    skipped: dict[str, int] = {}
    if data.is_dir():
        folders = sorted(p for p in data.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not folders:
            raise InputError(str(data), "no class sub-folders", expected="DIR/<class>/<image files>")
        for folder in folders:
            for f in sorted(folder.rglob("*")):
                if not f.is_file():
                    continue
                if f.suffix.lower() not in IMAGE_SUFFIXES:
                    skipped[f"not an image file ({f.suffix or 'no suffix'})"] = \
                        skipped.get(f"not an image file ({f.suffix or 'no suffix'})", 0) + 1
                    continue
                refs.append(ImageRef(path=f, name=str(f)))
                names.append(str(f.relative_to(data)))
                raw.append(folder.name)
        found = [f.name for f in folders]  # empty class folders are still candidate classes
    elif data.is_file():
        root = Path(images).expanduser() if images is not None else data.parent
        with open(data, encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            cols = reader.fieldnames or []
            pcol = "path" if "path" in cols else "image" if "image" in cols else None
            if pcol is None or "label" not in cols:
                raise InputError(f"{data}:1", "missing column", expected="a header with path (or image) and label",
                                 got=",".join(cols))
            for n, row in enumerate(reader, start=2):
                where = f"{data}:{n}"
                p, lab = (row.get(pcol) or "").strip(), (row.get("label") or "").strip()
                if not p or not lab:
                    raise InputError(where, f"empty {pcol!r} or 'label'", got=row)
                f = Path(p).expanduser()
                f = f if f.is_absolute() else root / f
                if not f.is_file():
                    raise InputError(where, f"image not found under {root}", got=p)
                refs.append(ImageRef(path=f, name=f"{where}: image {p}"))
                names.append(p)
                raw.append(lab)
        found = sorted(set(raw), key=lambda x: (len(x), x) if x.isdigit() else (0, x))
    else:
        raise InputError(str(data), "--data not found", expected="an ImageNet-style folder or a path,label CSV")
    if not refs:
        raise InputError(str(data), "no images")
    order, cnames = _read_classnames(classnames, found)
    index = {lab: i for i, lab in enumerate(order)}
    missing = sorted(set(raw) - set(index))
    if missing:
        raise CapscoreError(f"{classnames}: no class name for label {missing[0]!r} "
                            f"({len(missing)} label(s) of the data are missing)")
    info = {"source_kind": "folder" if data.is_dir() else "csv", "n_images": len(refs), "n_classes": len(order),
            "classnames": classnames or "labels", "skipped": skipped}
    return ClassificationSet(tuple(refs), tuple(names), tuple(index[x] for x in raw), tuple(cnames), info)


# ============================================================================ runner
def zeroshot_task(encoder: Encoder, data: ClassificationSet, templates: Sequence[Callable[[str], str]], *,
                  task: str = "") -> tuple[list[dict], dict]:
    """Classify every image -> (per-image rows, one summary row)."""
    W = classifier(encoder, data.classnames, templates)  # (C, D)
    img = encoder.encode_images(list(data.images))  # (N, D)
    logits = img.double() @ W.double().T  # (N, C)
    ranks = class_ranks(logits, data.labels)
    top = torch.topk(logits, k=min(5, len(data.classnames)), dim=1).indices.numpy()
    rows = [{"task": task, "image": n, "label": data.classnames[y], "rank": int(r),
             "top5": [data.classnames[j] for j in t], "correct": bool(r == 1)}
            for n, y, r, t in zip(data.names, data.labels, ranks, top)]
    summary = {"task": task, "n_images": len(ranks), "n_classes": len(data.classnames),
               "n_templates": len(templates), "unit": "%", **accuracies(ranks, data.labels, len(data.classnames)),
               "n_files_skipped": sum(data.info.get("skipped", {}).values())}
    return rows, summary


def run_zeroshot(encoder: Encoder, data: ClassificationSet | Sequence[tuple[str, ClassificationSet]], *,
                 templates: str = "openai", suite: str = "zeroshot", source: str = "", seed: int = 0):
    """One or several (task, data) classification tasks with one template set -> ProbeResult."""
    tasks = [("", data)] if isinstance(data, ClassificationSet) else list(data)
    temps = get_templates(templates)
    rows, summary = [], []
    for task, ds in tasks:
        r, s = zeroshot_task(encoder, ds, temps, task=task)
        rows += r
        summary.append(s)
    params = {"templates": templates, "n_templates": len(temps),
              **({"data": tasks[0][1].info} if len(tasks) == 1 else {t: d.info for t, d in tasks})}
    bb = encoder.backbone
    return ProbeResult(suite, bb.spec, bb.identity, "cosine", params, seed, source, tuple(rows), tuple(summary))

"""The trained model on disk: an OpenAI-format checkpoint the loader reads back, and a model card."""
from __future__ import annotations

import json
from pathlib import Path

from capscore.backbones.base import Backbone
from capscore.backbones.openai_ckpt import save_openai_checkpoint


def export_model(backbone: Backbone, path: str | Path) -> Path:
    """Write ``backbone`` for ``--model ckpt:PATH``. A stretched (248-token) tower is written in
    LongCLIP's two-table layout (``positional_embedding`` + ``positional_embedding_res``)."""
    stretched = getattr(backbone.model, "_capscore_keep", None) is not None
    return save_openai_checkpoint(backbone, path, layout="longclip" if stretched else "plain")


def write_model_card(folder: str | Path, *, recipe: str, citation: str, base_model: str, params: dict,
                     config: dict, evals: list[dict], model_path: str, data: str, command: str = "") -> Path:
    """``MODEL_CARD.md`` (for people) and ``card.json`` (for programs) with everything needed to redo the run."""
    folder = Path(folder)
    card = {"recipe": recipe, "citation": citation, "base_model": base_model, "load_with": f"ckpt:{model_path}",
            "data": data, "recipe_params": params, "train_config": config, "evaluation": evals, "command": command}
    (folder / "card.json").write_text(json.dumps(card, indent=2, default=str))
    lines = [f"# capscore-trained metric backbone ({recipe})", "",
             f"- recipe: `{recipe}` — {citation}", f"- base model: `{base_model}`",
             f"- load with: `--model ckpt:{model_path}`", f"- data: {data}"]
    if command:
        lines.append(f"- command: `{command}`")
    lines += ["", "## Hyper-parameters", "", "| name | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in {**config, **params}.items()]
    if evals:
        keys = [k for k in evals[0] if k != "step"]
        lines += ["", "## Evaluation (held-out)", "", "| step | " + " | ".join(keys) + " |",
                  "|---" * (len(keys) + 1) + "|"]
        for e in evals:
            lines.append(f"| {e['step']} | " + " | ".join(f"{e.get(k, float('nan')):.4f}" for k in keys) + " |")
    (folder / "MODEL_CARD.md").write_text("\n".join(lines) + "\n")
    return folder / "MODEL_CARD.md"

"""What is present and what is missing for the papers' protocols — offline, touches nothing.

Datasets in their published layouts under the data root, the weights files the reproduction tables name
under the weights root, the released files of the metrics with their own models (Polos, DENEB, the
judges) under the metric-weights folder, Java (PTB tokenizer, METEOR, SPICE), pycocoevalcap, the CoreNLP jars SPICE needs,
and the GPU.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from importlib.metadata import version as pkg_version

from capscore.meta.reproduce import (
    DATA_LAYOUT, data_files, missing_data, missing_weights, read_table, table_names, weights_file,
)
from capscore.report.tables import format_table
from capscore.scores import classic
from capscore.scores.learned import weights_dir, weights_files


def checks(data_root: Path, weights_root: Path, metric_weights: Path | None = None) -> list[tuple[str, str, bool, str]]:
    """(group, item, present, detail) for every check; ``metric_weights``: the folder of the metrics with
    their own models (:func:`capscore.scores.learned.weights_files`), default the documented one."""
    out = []
    for ds in DATA_LAYOUT:
        why = missing_data(ds, data_root)
        out.append(("dataset", ds, not why, why.removeprefix("data not found: ") if why else
                    str(data_files(ds, data_root)[0])))  # an empty file reads "data file is empty (0 bytes): P"
    seen: dict[str, str] = {}
    for t in table_names():
        for r in read_table(t):
            wf = weights_file(r.model, weights_root)
            if wf is not None and str(wf) not in seen:
                seen[str(wf)] = r.backbone
    for wf, name in seen.items():
        why = missing_weights(Path(wf))
        out.append(("weights", name, not why, wf if not why or why.startswith("weights not found") else why))
    for metric, what, path, ok, source in weights_files(weights_dir(metric_weights)):
        out.append(("metric weights", f"{metric}: {what}", ok, str(path) if ok else f"{path} (published at {source})"))
    java = classic.java()
    version = ""
    if java:
        try:
            proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
            version = (proc.stderr or proc.stdout).strip().splitlines()[0] if (proc.stderr or proc.stdout) else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            version = f"does not run ({e})"
    out.append(("tool", "java (PTB tokenizer, METEOR, SPICE)", bool(java),
                f"{java}: {version}" if java else "not on PATH (Debian: apt-get install default-jre-headless)"))
    try:
        pv = pkg_version("pycocoevalcap")
        out.append(("tool", "pycocoevalcap", True, pv))
    except Exception:  # noqa: BLE001  (PackageNotFoundError)
        out.append(("tool", "pycocoevalcap", False, "pip install 'capscore[classic]'"))
    found = classic.corenlp_dir()
    if found is not None:
        detail = str(found)
    else:  # name the jars that are there but broken (an empty download, an HTML error page saved as .jar)
        broken = [f"{d / j}: {why}" for d in classic.spice_dirs() for j in classic.CORENLP_JARS
                  if (why := classic.jar_problem(d / j)) not in (None, "missing")]
        detail = "; ".join(broken[:2]) + "; " if broken else ""
        detail += f"put {' and '.join(classic.CORENLP_JARS)} in {classic.spice_dirs()[0]}"
    out.append(("tool", "CoreNLP 3.6.0 jars (SPICE)", found is not None, detail))
    import torch  # noqa: PLC0415  (deferred: torch)

    gpu = torch.cuda.is_available()
    out.append(("device", "GPU (CUDA)", gpu, torch.cuda.get_device_name(0) if gpu else "none: models run on the CPU"))
    return out


def format_checks(rows: list[tuple[str, str, bool, str]]) -> str:
    """:func:`checks` as a table and a count line."""
    missing = sum(1 for r in rows if not r[2])
    return "\n".join([format_table([{"what": g, "item": i, "status": "present" if ok else "MISSING", "detail": d}
                                     for g, i, ok, d in rows], indent=""),
                      f"{len(rows) - missing} present, {missing} missing"])

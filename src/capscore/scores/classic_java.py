"""The Java tools of the classic metrics, run safely: the PTB tokenizer, a long-lived METEOR 1.5 process, SPICE.

Every tool here reads text a line at a time, so a text holding a line break would shift every text after it
(and, cached, poison later calls). :func:`line_safe` is applied to every text before it reaches a tool:
every character that any of them — or Python's ``str.splitlines`` — treats as a line break, and every other
control character, becomes a space (of all Unicode, ``\\n``, ``\\r``, ``\\v``, ``\\f``, U+2028 and U+2029
start a new line in the PTB jar; ``\\x1c``–``\\x1e`` and U+0085 are line breaks for Python). Answers are
then matched back by text, not by position, and their number is checked, so a tool that still splits or
drops a line is a one-line error, never a silently shifted result.

METEOR's ``-stdio`` protocol separates fields with ``|||``: :func:`meteor_safe` removes it from every
hypothesis and reference (pycocoevalcap removes it from the hypothesis only, so a reference holding it
became two references). SPICE reads JSON and the PTB tokenizer one line per text; neither has a field
separator of its own.

A tool that dies is a :class:`~capscore.errors.CapscoreError` with the last line it wrote to stderr; one
that stops answering is killed after ``timeout`` seconds without output (``$CAPSCORE_JAVA_TIMEOUT``,
default :data:`DEFAULT_TIMEOUT`) — never a hang. Processes are killed when their session closes, on
Ctrl-C in the middle of an exchange, and at interpreter exit.
"""
from __future__ import annotations

import atexit
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from capscore.errors import CapscoreError

DEFAULT_TIMEOUT = 120.0
CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
# pycocoevalcap.tokenizer.ptbtokenizer.PUNCTUATIONS: the tokens its tokenisation drops
PUNCTUATIONS = frozenset(["''", "'", "``", "`", "-LRB-", "-RRB-", "-LCB-", "-RCB-",
                          ".", "?", "!", ",", ":", "-", "--", "...", ";"])
# the Java tools parse their own numbers with the JVM's locale (METEOR's Scanner.nextDouble): pin it
_JVM_LOCALE = ("-Duser.language=en", "-Duser.country=US")


def _unsafe_table() -> dict[int, str]:
    table = {c: " " for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}  # Cc, Zl, Zp
    table.update((c, "\ufffd") for c in range(0xD800, 0xE000))  # lone surrogates
    return table


_UNSAFE = _unsafe_table()
_UNSAFE_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def line_safe(text: str) -> str:
    """``text`` with every line or paragraph separator and every control character (Unicode categories Cc,
    Zl, Zp) replaced by a space, and any lone surrogate (which cannot be written as UTF-8) by U+FFFD; the
    same object when there is none."""
    return text.translate(_UNSAFE) if _UNSAFE_CHAR.search(text) else text


def meteor_safe(text: str) -> str:
    """A text as METEOR's ``-stdio`` protocol may carry it: without ``|||`` (removed, then a double space
    made single, as pycocoevalcap treats the hypothesis)."""
    return text.replace("|||", "").replace("  ", " ") if "|||" in text else text


# ------------------------------------------------------------------------------------ environment
def java() -> str | None:
    """Path of the ``java`` executable on PATH, or ``None``."""
    return shutil.which("java")


def need_java(what: str) -> str:
    """The ``java`` executable, or a one-line error saying ``what`` needs it."""
    exe = java()
    if exe is None:
        raise CapscoreError(f"{what} needs Java, which was not found on PATH: install a Java runtime "
                            "(Debian/Ubuntu: apt-get install default-jre-headless)")
    return exe


def pycoco_dir() -> Path:
    """pycocoevalcap's package folder (its jars live there), or a one-line error saying how to install it."""
    try:
        import pycocoevalcap
    except ImportError:
        raise CapscoreError("the classic metrics (BLEU, METEOR, ROUGE-L, CIDEr, SPICE) need pycocoevalcap: "
                            "pip install 'capscore[classic]'") from None
    return Path(next(iter(pycocoevalcap.__path__)))  # a namespace package: no __file__


def timeout_default() -> float:
    raw = os.environ.get("CAPSCORE_JAVA_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CapscoreError(f"$CAPSCORE_JAVA_TIMEOUT must be a number of seconds > 0; got {raw!r} instead.")
    return value


# ------------------------------------------------------------------------------------ processes
_LIVE: "weakref.WeakSet[JavaProcess]" = weakref.WeakSet()


@atexit.register
def _kill_all() -> None:
    for p in list(_LIVE):
        p.close()


class JavaProcess:
    """One Java tool speaking lines over stdin/stdout: a reader thread queues its output lines, so a read
    waits at most ``timeout`` seconds for the next one; stderr goes to a temporary file (its last line
    names the failure). ``exchange`` is the only way to talk to it."""

    def __init__(self, cmd: Sequence[str], *, cwd: Path, what: str, timeout: float):
        self.what, self.timeout = what, timeout
        self._err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(list(cmd), cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._err)
        except OSError as e:
            self._err.close()
            raise CapscoreError(f"{what} (java) could not start: {e}") from None
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout, self._lines), daemon=True).start()
        _LIVE.add(self)

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        try:
            for raw in stream:
                lines.put(raw)
        except (OSError, ValueError):
            pass
        lines.put(None)  # end of output

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_error(self) -> str:
        """The last non-empty line the tool wrote to stderr (or its exit status)."""
        try:
            self._err.seek(0)
            tail = self._err.read()[-4000:].decode("utf-8", "replace")
        except (OSError, ValueError):
            tail = ""
        lines = [ln.strip() for ln in tail.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
        code = self.proc.poll()
        return lines[-1] if lines else (f"exit code {code}" if code is not None else "no answer")

    def exchange(self, payload: bytes, n_answers: int, *, close_input: bool = False,
                 name: Callable[[int], str] | None = None) -> list[str]:
        """Write ``payload`` (from a thread: the tool may answer before it has read everything), then read
        ``n_answers`` lines — or, with ``close_input``, close stdin and read every line up to the end of
        output. Any failure (death, silence, Ctrl-C) kills the process; ``name(i)`` names what the first
        unanswered line (the i-th) was about in the error."""
        writer = threading.Thread(target=self._write, args=(payload, close_input), daemon=True)
        out: list[str] = []
        try:
            writer.start()
            while close_input or len(out) < n_answers:
                try:
                    raw = self._lines.get(timeout=self.timeout)
                except queue.Empty:
                    self.close()
                    raise CapscoreError(f"{self.what} (java) gave no answer for {self.timeout:g} s"
                                        f"{self._where(name, len(out))}; it was stopped (set "
                                        "$CAPSCORE_JAVA_TIMEOUT to wait longer)") from None
                if raw is None:
                    if close_input:
                        break
                    self.settle()
                    msg = self.last_error()
                    self.close()
                    raise CapscoreError(f"{self.what} (java) stopped{self._where(name, len(out))}: {msg}")
                out.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
        except BaseException:
            self.close()  # a half-finished exchange leaves the protocol out of step: never reuse it
            raise
        return out

    def settle(self, timeout: float = 5.0) -> int | None:
        """Wait up to ``timeout`` seconds for the process to end; its exit code, or None if it has not."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def _write(self, payload: bytes, close_input: bool) -> None:
        try:
            self.proc.stdin.write(payload)
            self.proc.stdin.flush()
            if close_input:
                self.proc.stdin.close()
        except (OSError, ValueError):
            pass  # the process died: the reader reports it

    @staticmethod
    def _where(name: Callable[[int], str] | None, done: int) -> str:
        return f" at {name(done)}" if name is not None else ""

    def close(self) -> None:
        """Kill the process, then release its pipes (idempotent). The kill comes first: a reader or writer
        thread blocked on a pipe holds its lock until the process ends."""
        _LIVE.discard(self)
        proc = getattr(self, "proc", None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kill that does not end it
            pass
        for stream in (proc.stdin, proc.stdout, self._err):
            try:
                stream.close()
            except (OSError, ValueError):
                pass


# ------------------------------------------------------------------------------------ PTB tokenizer
def ptb_tokenize(texts: Sequence[str], *, timeout: float) -> list[str]:
    """pycocoevalcap's ``PTBTokenizer`` on line-safe ``texts`` in one JVM: CoreNLP 3.4.1's PTB tokenizer
    with ``-preserveLines -lowerCase``, one text per line, then pycocoevalcap's punctuation tokens
    dropped. Each text is alone on its line, so its tokens do not depend on the others."""
    if not texts:
        return []
    exe = need_java("PTB tokenisation (the COCO tokenizer of pycocoevalcap; tokenizer='simple' is a Java-free "
                    "approximation)")
    jar = pycoco_dir() / "tokenizer" / "stanford-corenlp-3.4.1.jar"
    proc = JavaProcess([exe, *_JVM_LOCALE, "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer",
                        "-preserveLines", "-lowerCase"], cwd=jar.parent, what="the PTB tokenizer",
                       timeout=timeout)
    try:
        lines = proc.exchange(("\n".join(texts) + "\n").encode("utf-8"), 0, close_input=True)
        if proc.settle(timeout) != 0:
            raise CapscoreError(f"the PTB tokenizer (java) failed: {proc.last_error()}")
    finally:
        proc.close()
    if len(lines) != len(texts):
        raise CapscoreError(f"the PTB tokenizer returned {len(lines)} lines for {len(texts)} texts")
    return [" ".join(w for w in line.rstrip().split(" ") if w not in PUNCTUATIONS) for line in lines]


# ------------------------------------------------------------------------------------ METEOR
class Meteor:
    """One METEOR 1.5 process (pycocoevalcap's jar and arguments: ``-stdio -l en -norm``, 2 GB heap) for
    any number of requests. :meth:`stats` returns the jar's statistics line per (hypothesis, references);
    :meth:`evaluate` its per-segment scores and aggregate score for a list of statistics lines."""

    def __init__(self, *, timeout: float):
        exe = need_java("METEOR")
        jar = pycoco_dir() / "meteor" / "meteor-1.5.jar"
        self._p = JavaProcess([exe, *_JVM_LOCALE, "-jar", "-Xmx2G", str(jar), "-", "-", "-stdio", "-l", "en",
                               "-norm"], cwd=jar.parent, what="METEOR", timeout=timeout)
        self._lock = threading.Lock()  # one exchange at a time: answers come back in the order asked

    @property
    def alive(self) -> bool:
        return self._p.alive

    def stats(self, pairs: Sequence[tuple[str, Sequence[str]]], names: Sequence[str]) -> list[str]:
        """The statistics line of each (hypothesis, references) pair (texts already line-safe);
        ``names[i]`` names pair i in an error."""
        lines = []
        for hyp, refs in pairs:
            lines.append(" ||| ".join(("SCORE", " ||| ".join(meteor_safe(r) for r in refs), meteor_safe(hyp))))
        with self._lock:
            answers = self._p.exchange(("\n".join(lines) + "\n").encode("utf-8"), len(lines),
                                       name=lambda i: names[i])
        for i, a in enumerate(answers):
            if not _is_stats(a):
                self.close()
                raise CapscoreError(f"METEOR (java) answered {a[:80]!r} for {names[i]}, not a statistics line")
        return answers

    def evaluate(self, stats: Sequence[str]) -> tuple[list[float], float]:
        """(per-segment scores, aggregate score) of the jar for these statistics lines."""
        with self._lock:
            answers = self._p.exchange(("EVAL ||| " + " ||| ".join(stats) + "\n").encode("utf-8"), len(stats) + 1)
        try:
            values = [float(a) for a in answers]
        except ValueError:
            bad = next(a for a in answers if not _is_number(a))
            self.close()
            raise CapscoreError(f"METEOR (java) answered {bad[:80]!r}, not a number") from None
        return values[:-1], values[-1]

    def close(self) -> None:
        self._p.close()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_stats(text: str) -> bool:
    parts = text.split()
    return len(parts) == 23 and all(_is_number(p) for p in parts)


# ------------------------------------------------------------------------------------ SPICE
def spice_dirs() -> list[Path]:
    """Where the CoreNLP jars for SPICE are looked for, in order (see :mod:`capscore.scores.classic`)."""
    from capscore.embed import cache as embed_cache  # noqa: PLC0415  (deferred: numpy)

    dirs = []
    if os.environ.get("CAPSCORE_SPICE_DIR"):
        dirs.append(Path(os.environ["CAPSCORE_SPICE_DIR"]).expanduser())
    dirs.append(embed_cache.DEFAULT_CACHE_DIR / "spice")
    try:
        dirs.append(pycoco_dir() / "spice" / "lib")
    except CapscoreError:
        pass
    return dirs


def corenlp_dir() -> Path | None:
    """The first folder of :func:`spice_dirs` holding both CoreNLP 3.6.0 jars, or ``None``."""
    return next((d for d in spice_dirs() if all(jar_problem(d / j) is None for j in CORENLP_JARS)), None)


def jar_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable jar (missing, empty, not a zip archive), or ``None`` when it is one:
    a jar is a zip file, which starts with the bytes ``PK\x03\x04`` (an empty one, ``PK\x05\x06``)."""
    try:
        if not path.is_file():
            return "missing"
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    if size == 0:
        return "empty (0 bytes)"
    if head not in (b"PK\x03\x04", b"PK\x05\x06"):
        return f"not a jar (a jar is a zip archive; {size:,} bytes starting {head!r})"
    return None


def spice_jars() -> Path:
    found = corenlp_dir()
    if found is None:
        where = spice_dirs()[0]
        why = [f"{where / j}: {p}" for j in CORENLP_JARS if (p := jar_problem(where / j)) not in (None, "missing")]
        raise CapscoreError(f"SPICE needs the Stanford CoreNLP 3.6.0 jars ({' and '.join(CORENLP_JARS)}, from "
                            f"stanford-corenlp-full-2015-12-09.zip); put them in {where} "
                            "(or set CAPSCORE_SPICE_DIR to their folder)" + (f"; found {'; '.join(why)}" if why else ""))
    return found


def run_spice(items: Sequence[tuple[str, Sequence[str]]], *, timeout: float) -> list[float]:
    """SPICE F (``All.f``, NaN where the jar gives none) of each (candidate, references) pair, in one run of
    pycocoevalcap's SPICE 1.0 jar (its main class and arguments) with the CoreNLP jars from a local folder,
    its temporary files and parse cache under capscore's cache. The jar may take ``timeout`` seconds plus
    one second per item."""
    from capscore.embed import cache as embed_cache  # noqa: PLC0415  (deferred: numpy)

    exe = need_java("SPICE")
    jars = spice_jars()
    spice_dir = pycoco_dir() / "spice"
    work = embed_cache.DEFAULT_CACHE_DIR / "spice"
    (work / "cache").mkdir(parents=True, exist_ok=True)
    cp = os.pathsep.join([str(spice_dir / "spice-1.0.jar"), str(spice_dir / "lib" / "*"),
                          *(str(jars / j) for j in CORENLP_JARS)])
    data = [{"image_id": i, "test": c, "refs": list(rs)} for i, (c, rs) in enumerate(items)]
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        inp, outp = Path(tmp) / "in.json", Path(tmp) / "out.json"
        inp.write_text(json.dumps(data), encoding="utf-8")
        cmd = [exe, *_JVM_LOCALE, "-Xmx8G", "-cp", cp, "edu.anu.spice.SpiceScorer", str(inp), "-cache",
               str(work / "cache"), "-out", str(outp), "-subset", "-silent"]
        try:
            proc = subprocess.run(cmd, cwd=spice_dir, capture_output=True, text=True, errors="replace",
                                  timeout=timeout + len(items))
        except subprocess.TimeoutExpired:
            raise CapscoreError(f"SPICE (java) did not finish {len(items)} items in {timeout + len(items):g} s; "
                                "it was stopped (set $CAPSCORE_JAVA_TIMEOUT to wait longer)") from None
        except OSError as e:
            raise CapscoreError(f"SPICE (java) could not start: {e}") from None
        if proc.returncode != 0 or not outp.exists():
            last = ([ln for ln in proc.stderr.splitlines() if ln.strip()] or ["no output"])[-1].strip()
            raise CapscoreError(f"SPICE (java) failed with exit code {proc.returncode}: {last}")
        try:
            results = json.loads(outp.read_text(encoding="utf-8"))
            by_id = {r["image_id"]: r["scores"]["All"]["f"] for r in results}
        except (ValueError, KeyError, TypeError) as e:
            raise CapscoreError(f"SPICE (java) wrote an output that is not its JSON ({e})") from None
    if set(by_id) != set(range(len(items))):
        raise CapscoreError(f"SPICE (java) returned {len(by_id)} results for {len(items)} items")
    return [_float_or_nan(by_id[i]) for i in range(len(items))]


def _float_or_nan(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")

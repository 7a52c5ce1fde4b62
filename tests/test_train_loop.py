"""The shared loop: schedule, data order, each recipe lowers its loss, exact resume, data files."""
from __future__ import annotations

import json
import math
import random
import warnings

import pytest
import torch

from capscore.errors import CapscoreError, InputError
from capscore.train.data import negative_detail, read_jsonl, scene_examples
from capscore.train.loop import TrainConfig, autocast_dtype, batch_indices, lr_at, train
from capscore.train.recipes import get_recipe, make_step, resolve_params


def fresh(device: str = "cpu"):
    from capscore.backbones import load_backbone

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_backbone("capscore-test-tiny", seed=0, device=device)


@pytest.fixture(scope="module")
def scenes():
    return scene_examples(8, seed=5, languages=("de", "fr", "es", "ja"))


def test_lr_schedule_by_hand():
    cfg = TrainConfig(steps=12, lr=1.0, warmup=2, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == 0.5 and lr_at(1, cfg) == 1.0
    assert lr_at(2, cfg) == pytest.approx(1.0)  # cosine starts at the peak
    assert lr_at(7, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(pi/2) = 0
    assert lr_at(12, cfg) == pytest.approx(0.1)


def test_batch_order_epochs_and_determinism():
    cfg = TrainConfig(batch_size=3, seed=4)
    epoch0 = [i for k in range(3) for i in batch_indices(k, 10, cfg)]  # 10 // 3 = 3 batches, 1 dropped
    assert len(set(epoch0)) == 9
    assert batch_indices(1, 10, cfg) == batch_indices(1, 10, cfg)
    assert batch_indices(3, 10, cfg) != batch_indices(0, 10, TrainConfig(batch_size=3, seed=5))
    with pytest.raises(CapscoreError, match="larger than"):
        batch_indices(0, 2, cfg)


def test_negative_detail_comes_from_another_example():
    details = ["a red circle", "two blue squares here", "one green star"]
    rng = random.Random(0)
    for _ in range(20):
        d = negative_detail(details, 0, rng, shuffle_prob=0.0)
        assert d in details[1:]
    for _ in range(20):
        d = negative_detail(details, 1, rng, shuffle_prob=1.0)
        assert sorted(d.split()) in (sorted(details[0].split()), sorted(details[2].split()))


@pytest.mark.parametrize("name,sets,part", [
    ("contrastive", {}, "loss"),
    ("specs", {}, "loss"),
    ("pacs", {}, "loss"),
    ("prmcs", {"distill_steps": "100"}, "distill"),  # stage 1 only
    ("prmcs", {"distill_steps": "0"}, "loss"),  # stage 2 only
])
def test_each_recipe_lowers_its_loss(name, sets, part, scenes, tmp_path):
    torch.manual_seed(0)
    bb = fresh()
    r = get_recipe(name)
    p = resolve_params(r, sets)
    state = r.prepare(bb, p)
    cfg = TrainConfig(steps=8, batch_size=8, lr=2e-3, warmup=1, seed=0)
    res = train(bb, make_step(r, p), scenes, cfg, tmp_path, state=state)
    losses = [h[part] for h in res.history]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0], losses


def run_specs(tmp_path, scenes, *, steps, stop_after=None, resume=False, accum=2, keep=0):
    bb = fresh()
    r = get_recipe("specs")
    p = resolve_params(r, {})
    state = r.prepare(bb, p)
    cfg = TrainConfig(steps=steps, batch_size=4, accum=accum, lr=3e-3, warmup=2, ckpt_every=2, seed=1,
                      keep_checkpoints=keep)
    res = train(bb, make_step(r, p), scenes, cfg, tmp_path, state=state, stop_after=stop_after, resume=resume)
    return bb, res


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, scenes):
    full_bb, full = run_specs(tmp_path / "full", scenes, steps=6)
    _, part = run_specs(tmp_path / "cut", scenes, steps=6, stop_after=3)  # dies after step 3; last ckpt: step 2
    assert len(part.history) == 3
    bb, rest = run_specs(tmp_path / "cut", scenes, steps=6, resume=True)
    assert [h["step"] for h in rest.history] == [3, 4, 5, 6]
    assert [h["loss"] for h in rest.history] == [h["loss"] for h in full.history[2:]]
    assert rest.state == full.state  # SPECS margin carried through the checkpoint
    a, b = full_bb.model.state_dict(), bb.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(x) for x in (tmp_path / "cut" / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log if "loss" in x] == [1, 2, 3, 4, 5, 6]  # the lost step 3 is not logged twice


def test_keep_checkpoints_prunes_old_ones_and_resume_still_exact(tmp_path, scenes):
    full_bb, full = run_specs(tmp_path / "full", scenes, steps=6)
    assert sorted(d.name for d in (tmp_path / "full" / "checkpoints").iterdir()) == [
        "step-000002", "step-000004", "step-000006"]  # default: all kept
    _, part = run_specs(tmp_path / "cut", scenes, steps=6, stop_after=5, keep=1)
    assert [d.name for d in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step-000004"]
    bb, rest = run_specs(tmp_path / "cut", scenes, steps=6, resume=True, keep=1)
    assert [h["loss"] for h in rest.history] == [h["loss"] for h in full.history[4:]]
    a, b = full_bb.model.state_dict(), bb.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [d.name for d in (tmp_path / "cut" / "checkpoints").iterdir()] == ["step-000006"]


def test_resume_refuses_changed_options(tmp_path, scenes):
    run_specs(tmp_path, scenes, steps=2, accum=1)
    with pytest.raises(CapscoreError, match="batch_size"):
        bb = fresh()
        r = get_recipe("contrastive")
        train(bb, make_step(r, r.defaults()), scenes, TrainConfig(steps=2, batch_size=8, ckpt_every=2, seed=1, warmup=2,
                                                              lr=3e-3), tmp_path, resume=True)


def run_contrastive(tmp_path, scenes, amp, *, steps=3, resume=False, stop_after=None, device="cpu",
                    deterministic=False):
    """A few contrastive steps under ``amp``; returns the backbone, the history and the dtypes the image
    tower's forward produced inside the loop."""
    torch.manual_seed(0)
    bb = fresh(device)
    r = get_recipe("contrastive")
    p = resolve_params(r, {})
    seen, forward = set(), bb.forward_images

    def recording(px, **kw):
        out = forward(px, **kw)
        seen.add(out[0].dtype)
        return out

    bb.forward_images = recording
    cfg = TrainConfig(steps=steps, batch_size=8, lr=2e-3, warmup=1, seed=0, ckpt_every=2, amp=amp, device=device,
                      deterministic=deterministic)
    res = train(bb, make_step(r, p), scenes, cfg, tmp_path, state=r.prepare(bb, p), resume=resume,
                stop_after=stop_after)
    return bb, [h["loss"] for h in res.history], seen


def test_cpu_bf16_autocast_trains_in_bf16_with_fp32_weights(tmp_path, scenes):
    bb32, loss32, dt32 = run_contrastive(tmp_path / "fp32", scenes, "auto")  # auto on CPU: fp32
    bb16, loss16, dt16 = run_contrastive(tmp_path / "bf16", scenes, "bf16")
    assert dt32 == {torch.float32} and dt16 == {torch.bfloat16}  # the towers really ran in bf16
    assert all(v.dtype == torch.float32 for v in bb16.model.state_dict().values() if v.is_floating_point())
    assert loss16 != loss32  # another precision: not the same numbers
    # same start, same batches: bf16's 8-bit mantissa keeps every step's loss within 1 % of fp32's (a loss
    # that should fall would not be a test: over 3 different batches it need not, in either precision)
    assert all(abs(a - b) < 0.01 * b for a, b in zip(loss16, loss32, strict=True)), (loss16, loss32)
    start = fresh().model.state_dict()  # and the bf16 steps updated the fp32 weights
    assert any(not torch.equal(v, start[k]) for k, v in bb16.model.state_dict().items() if v.is_floating_point())
    run_contrastive(tmp_path / "off", scenes, "off", steps=2)
    with pytest.raises(CapscoreError, match="amp was off .*, now bf16"):  # resume keeps the precision
        run_contrastive(tmp_path / "off", scenes, "bf16", steps=2, resume=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("amp,dtype", [("off", torch.float32), ("auto", None), ("bf16", torch.bfloat16),
                                       ("fp16", torch.float16)])
def test_cuda_amp_runs_in_its_dtype_and_resumes_exactly(tmp_path, scenes, amp, dtype):
    """On CUDA every --amp mode trains with fp32 weights, and a run stopped after step 3 (checkpoint at 2)
    and resumed equals the uninterrupted one (the RNG states load on the CPU: torch.cuda.set_rng_state
    refuses CUDA tensors; fp16 also restores its GradScaler)."""
    full_bb, full, seen = run_contrastive(tmp_path / "full", scenes, amp, steps=6, device="cuda")
    run_contrastive(tmp_path / "cut", scenes, amp, steps=6, stop_after=3, device="cuda")
    bb, rest, _ = run_contrastive(tmp_path / "cut", scenes, amp, steps=6, resume=True, device="cuda")
    want = dtype or (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    assert seen == {want}
    assert rest == full[2:]
    a, b = full_bb.model.state_dict(), bb.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(v.dtype == torch.float32 for v in b.values() if v.is_floating_point())


def test_deterministic_mode_keeps_the_cpu_run_restores_torch_and_names_a_missing_kernel(tmp_path, scenes):
    """--deterministic: on the CPU (exact without it) the same losses and weights; torch's global mode is
    switched on only during the run and back after it, also after a failure; an operation with no
    deterministic kernel stops the run with a one-line error that names it."""
    bb, plain, _ = run_contrastive(tmp_path / "plain", scenes, "off")
    det_bb, det, _ = run_contrastive(tmp_path / "det", scenes, "off", deterministic=True)
    assert det == plain
    a, b = bb.model.state_dict(), det_bb.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.are_deterministic_algorithms_enabled()
    inside = []

    def no_kernel(backbone, batch, **_):
        inside.append(torch.are_deterministic_algorithms_enabled())
        torch.zeros(3).put_(torch.tensor([0, 0]), torch.ones(2))  # put_ without accumulate: no deterministic kernel
        raise AssertionError("put_ ran")

    cfg = TrainConfig(steps=1, batch_size=4, seed=0, deterministic=True)
    with pytest.raises(CapscoreError, match=r"^deterministic: put_ does not have a deterministic implementation"):
        train(fresh(), no_kernel, scenes, cfg, tmp_path / "bad")
    assert inside == [True] and not torch.are_deterministic_algorithms_enabled()


def test_amp_modes_and_cpu_fp16_refused():
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("off", cpu) is None
    assert autocast_dtype("bf16", cpu) == torch.bfloat16
    with pytest.raises(CapscoreError, match="amp='fp16' needs a CUDA device"):
        autocast_dtype("fp16", cpu)
    with pytest.raises(CapscoreError, match="The 'amp' parameter of train must be 'auto' or 'bf16' or 'fp16' or "
                                            "'off'; got 'fp8' instead."):
        autocast_dtype("fp8", cpu)


def test_jsonl_reader_and_field_errors(tmp_path, make_images):
    imgs = make_images(2)
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"image": str(imgs[0]), "caption": "a cat", "base": "a cat", "detail": "on a mat",
                             "translations": {"de": "eine Katze"}}) + "\n\n"
                 + json.dumps({"image": "images/" + imgs[1].name, "caption": "a dog"}) + "\n")
    rows = read_jsonl(f)
    assert rows[0].translations == (("de", "eine Katze"),) and rows[1].image.path == imgs[1]
    from capscore.train.data import check_fields

    with pytest.raises(InputError, match=r"train.jsonl:3: recipe 'specs' needs field 'base'"):
        check_fields(rows, ("caption", "base", "detail"), "specs")
    f.write_text('{"image": "x.png"}\n')
    with pytest.raises(InputError, match=r"train.jsonl:1: needs 'image'"):
        read_jsonl(f)


def test_resolve_params_types_and_unknown():
    r = get_recipe("specs")
    p = resolve_params(r, {"beta": "4", "fixed_margin": "0.2", "stretch": "0"})
    assert (p.beta, p.fixed_margin, p.stretch) == (4.0, 0.2, False)
    assert type(p.beta) is float and resolve_params(r, {"fixed_margin": "none"}).fixed_margin is None
    with pytest.raises(CapscoreError, match="did you mean 'gamma'"):
        resolve_params(r, {"gama": "1"})
    with pytest.raises(CapscoreError, match="did you mean 'specs'"):
        get_recipe("spec")


def test_cli_train_writes_loadable_checkpoint_and_card(tmp_path):
    from capscore.backbones import load_backbone
    from capscore.cli import main

    out = tmp_path / "run"
    argv = ["-q", "train", "contrastive", "--model", "capscore-test-tiny", "--data", "scenes:16", "--out", str(out),
            "--steps", "2", "--batch-size", "8", "--eval-scenes", "0", "--set", "stretch=1"]
    assert main(argv) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["recipe"] == "contrastive" and card["recipe_params"]["stretch"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = load_backbone(f"ckpt:{out / 'model.safetensors'}")
    assert back.context_length == 248
    assert main(argv + ["--set", "nope=1"]) == 2  # user error: one line, exit 2
    assert main(argv + ["--amp", "fp16"]) == 2  # fp16 autocast needs CUDA
    assert main(argv + ["--deterministic", "--out", str(tmp_path / "det")]) == 0
    def config(run):  # the loop's settings as the run's last checkpoint records them
        return json.loads(next((run / "checkpoints").glob("step-*/trainer.json")).read_text())["config"]

    assert config(tmp_path / "det")["deterministic"] is True and config(out)["deterministic"] is False


def test_the_bar_shows_the_loss_of_the_step_it_counts(tmp_path, scenes, monkeypatch):
    """When the bar draws step k (``update``), its postfix already holds step k's loss, not step k-1's."""
    import capscore.train.loop as L

    drawn = []

    class Bar:
        postfix = None

        def set_postfix(self, refresh=True, **kw):
            self.postfix = kw["loss"]

        def update(self, n=1):
            drawn.append(self.postfix)  # what a redraw now would show

        def close(self):
            pass

    monkeypatch.setattr(L, "open_bar", lambda *a, **k: Bar())
    r = get_recipe("contrastive")
    res = train(fresh(), make_step(r, r.defaults()), scenes, TrainConfig(steps=3, batch_size=4, warmup=1), tmp_path)
    assert drawn == [f"{e['loss']:.4f}" for e in res.history] and len(set(drawn)) == 3


def test_evaluating_on_the_built_in_scenes_does_not_warn_that_it_truncates_them():
    """The evaluator's long scene captions exceed a 77-token context (by design, see capscore.train.evaluate);
    training on capscore's own scenes says nothing about it, while a user's over-long caption still warns."""
    from capscore._log import CapscoreWarning
    from capscore.embed.engine import Encoder, MemoryCache
    from capscore.scenes import generate_scenes
    from capscore.train.evaluate import scene_evaluator

    bb = fresh()
    longest = max((s.long_caption() for s in generate_scenes(24, seed=10_000)), key=len)
    assert len(bb.tokenize([longest])[0]) > bb.context_length  # the evaluation data does exceed the context
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        scene_evaluator(24)(bb)
    assert not [w for w in seen if "longer than" in str(w.message)]
    with pytest.warns(CapscoreWarning, match="captions longer than the 77-token context"):
        Encoder(bb, cache=MemoryCache()).encode_texts([longest])

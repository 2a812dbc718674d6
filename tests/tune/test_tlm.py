"""The tensor language model: sentences of every template read back to the same configuration,
constrained decoding yields only valid new configurations (which build and compute the right result),
a tiny model learns from a few seconds of training and writes valid schedules for an operator it never
saw, the tuner resumes from records, and bad models, corpora and options get clear errors."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
from fake_measure import HashMeasurer

import polytile as pt
from polytile.tune import make_task, tune_task
from polytile.tune.space import TuneError
from polytile.tune.task import Task, list_templates
from polytile.tune.tlm import corpus, networks
from polytile.tune.tlm.decode import Completions, generate
from polytile.tune.tlm.model import TLM, ModelShape
from polytile.tune.tlm.sentence import config_words, decision_words, read_sentence, sentence, words_config
from polytile.tune.tlm.train import TrainOptions, fit, loss_of

TINY = ModelShape(layers=2, width=64, heads=2, positions=96)
# operators no network layer uses, at small sizes
EXTRA_SHAPES = {"conv3d_igemm": [dict(N=1, D=6, H=10, W=10, C=32, K=32, T=3, R=3, S=3, padding=1),
                                  # few input channels (a video's colors: the CUDA-core template)
                                  dict(N=1, D=6, H=10, W=10, C=3, K=16, T=3, R=3, S=3, padding=1)],
                "conv2d_nhwc": [dict(N=1, H=20, W=20, C=16, K=24, R=3, S=3, padding=1)],
                # an image's colors on the tensor cores (conv2d_igemm_rows); an NCHW float32 convolution
                # (its implicit GEMM on the CUDA cores: conv2d_gemm_cuda)
                "conv2d_igemm": [dict(N=1, H=20, W=20, C=3, K=24, R=3, S=3, padding=1, dtype="float16"),
                                 dict(N=1, H=20, W=20, C=3, K=24, R=3, S=3, padding=1, dtype="float32")],
                "conv2d": [dict(N=1, C=16, H=14, W=14, K=32, R=3, S=3, padding=1)],
                # a decoding step's products (at most 16 rows: the GEMV templates); the networks' layers
                # are at prefill sizes
                "matmul": [dict(M=3, N=200, K=328, dtype="float16")],
                "batch_matmul": [dict(batch=5, M=1, N=72, K=136, dtype="float16")]}


def _func() -> pt.Func:
    A = pt.placeholder((37, 29), "float32", "A")
    B = pt.placeholder((29, 45), "float32", "B")
    k = pt.reduce_axis(29, "k")
    C = pt.compute((37, 45), lambda i, j: pt.sum(A[i, k] * B[k, j], axis=k), "C")
    return pt.Func([A, B], C)


def example_task(template) -> Task | None:  # noqa: ANN001
    """A workload ``template`` applies to, from the networks' layers (or ``EXTRA_SHAPES``), on a corpus
    target of its kind."""
    if template.op == "func":
        task = make_task(_func(), corpus.targets(template.kind)[0], template)
        if template.applies is not None and not template.applies(task.op, task.target):
            return None  # a template of other Funcs (polytile.torch's imported groups)
        return task
    shapes = [args for _, op, args in corpus.workloads(template.kind, list(networks.NETWORKS)) if op == template.op]
    shapes = shapes[:4] + EXTRA_SHAPES.get(template.op, [])
    for target in corpus.targets(template.kind):
        for args in shapes:
            task = make_task(template.op, target, template, **args)
            if template.applies is None or template.applies(task.op, target):
                return task
    raise AssertionError(f"no example workload for template {template.name}: add one to EXTRA_SHAPES")


def test_every_template_round_trips_through_sentences():
    rng = np.random.default_rng(3)
    templates = [t for t in list_templates() if t.fn.__module__.startswith("polytile.")]  # not the tests' own
    assert {"matmul_cpu", "matmul_tensorcore", "matmul_wgmma", "generic_cpu", "conv2d_cuda"} <= \
        {t.name for t in templates}
    checked = set()
    for template in templates:
        task = example_task(template)
        if task is None:
            continue
        checked.add(template.name)
        space = task.space
        for dw, d in zip(decision_words(space), space.decisions, strict=True):  # every choice's word
            assert [dw.digit(w) for w in dw.words] == list(range(len(d.choices))), template.name
            assert all(" " not in w and w.startswith(f"{d.name}=") for w in dw.words)
        picks = [space.config((0,) * len(space.decisions)).digits, *space.sample_valid(rng, 30)]
        for digits in picks:
            config = space.config(digits)
            text = sentence(task, config)
            assert read_sentence(task, text) == config, (template.name, text)
            assert words_config(space, config_words(space, config.to_json())) == config
            assert sentence(task, read_sentence(task, text)) == text
    # every template of polytile's operators and plain Funcs was exercised (torch's need an imported group)
    assert {t.name for t in templates if t.op != "func" or t.applies is None} <= checked


def test_sentence_words_and_errors():
    task = make_task("matmul", corpus.targets("cpu")[0], M=512, N=3072, K=197)
    text = sentence(task, task.space.config_at(0))
    prompt = text.split(" [SEP] ")[0].split()
    assert "M~9" in prompt and "N~11.5" in prompt and "K~7.5" in prompt and "op=matmul" in prompt
    assert "cores=2" in prompt and "vector=512b" in prompt and "template=matmul_cpu" in prompt
    words = [("mr=999" if w.startswith("mr=") else w) for w in text.split()]
    with pytest.raises(TuneError, match="'mr=999' is not a choice of decision 'mr'"):
        read_sentence(task, " ".join(words))
    with pytest.raises(TuneError, match="one \\[SEP\\]"):
        read_sentence(task, "op=matmul mr=4")
    other = make_task("matmul", corpus.targets("cpu")[0], M=64, N=64, K=64)
    with pytest.raises(TuneError, match="is not that of"):
        read_sentence(other, text)


def _sentences(tasks: list[Task], per_task: int, rng: np.random.Generator) -> list[str]:
    return [sentence(t, t.space.config(d)) for t in tasks for d in t.space.sample_valid(rng, per_task)]


def _words(tasks: list[Task]) -> list[str]:
    return [w for t in tasks for dw in decision_words(t.space) for w in dw.words]


@pytest.fixture(scope="module")
def training_tasks() -> list[Task]:
    cpu = corpus.targets("cpu")[0]
    return [make_task("matmul", cpu, M=m, N=n, K=k) for m, n, k in ((128, 768, 768), (512, 3072, 768))] + \
           [make_task("conv2d", cpu, **args) for _, op, args in networks.layers(["resnet-50"])[:4] if op == "conv2d"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, training_tasks) -> tuple[TLM, str]:  # noqa: ANN001
    rng = np.random.default_rng(0)
    texts = _sentences(training_tasks, 40, rng)
    tlm = TLM.create(texts, "cpu", TINY, seed=0, device="cpu", words=_words(training_tasks))
    folder = tmp_path_factory.mktemp("tlm") / "tiny"
    tlm.save(folder)
    return tlm, str(folder)


def _fresh_check(op: str, target: object, template: str | None, shape: dict) -> Task:
    """A new task of the same workload: its validity cache owes nothing to the decoder's."""
    return make_task(op, target, template, **shape)


def test_constrained_decoding_of_an_untrained_model_is_always_valid(tiny_model):
    tlm, _ = tiny_model
    cpu, h100 = corpus.targets("cpu")[0], corpus.targets("cuda")[1]
    cases = [("matmul", cpu, None, dict(M=100, N=300, K=200), 400),  # a large space: witness search
             ("conv2d", cpu, None, dict(N=1, C=24, H=30, W=30, K=40, R=3, S=3, padding=1), 300),  # exact masks
             ("matmul", h100, "matmul_tensorcore", dict(M=300, N=200, K=520, dtype="float16"), 300)]
    gpu_words = make_task(*cases[2][:3], **cases[2][3])
    models = {"cpu": tlm, "cuda": TLM.create([sentence(gpu_words, gpu_words.space.config_at(0))], "cuda", TINY,
                                              device="cpu", words=_words([gpu_words]))}
    total = 0
    for op, target, template, shape, n in cases:
        task = make_task(op, target, template, **shape)
        model = models[target.kind]
        rng = np.random.default_rng(1)
        measured = set(task.space.sample_valid(rng, 20))
        completions = Completions(task.space, measured, rng)
        samples = []
        while len(samples) < n:
            got = generate(model, task, min(100, n - len(samples)), completions, rng, temperature=1.5)
            assert got, "the decoder stopped before the space ran out"
            samples += got
            measured.update(s.digits for s in got)
        checker = _fresh_check(op, target, template, shape).space
        digits = [s.digits for s in samples]
        assert len(set(digits)) == len(digits)  # never the same configuration twice
        for d in digits:
            assert checker.reason_invalid(d) is None, checker.config(d)
        total += len(samples)
    assert total == 1000
    # what the decoder writes builds and computes the right result (sizes that divide no tile)
    task = make_task("matmul", cpu, M=100, N=300, K=200)
    sample = generate(tlm, task, 1, Completions(task.space, set(), np.random.default_rng(5)),
                      np.random.default_rng(5))[0]
    kern = pt.build(task.schedule(task.space.config(sample.digits).values), "cpu")
    a, b = task.op.make_inputs(np.random.default_rng(7))
    assert np.allclose(kern(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_decoding_exhausts_a_small_space_then_stops(tiny_model):
    tlm, _ = tiny_model
    task = make_task("softmax", corpus.targets("cpu")[0], M=30, N=50)
    valid = {d for d in (task.space.config_at(i).digits for i in range(task.space.size)) if task.space.is_valid(d)}
    seen: set = set()
    rng = np.random.default_rng(2)
    completions = Completions(task.space, seen, rng)
    while True:
        got = generate(tlm, task, 4, completions, rng)
        if not got:
            break
        seen.update(s.digits for s in got)
    assert seen == valid


def test_a_tiny_model_learns_and_writes_valid_schedules_for_an_unseen_operator(tiny_model, training_tasks):
    tlm0, _ = tiny_model
    tlm = TLM(tlm0.tokenizer, copy.deepcopy(tlm0.model), dict(tlm0.meta))
    rng = np.random.default_rng(4)
    texts = _sentences(training_tasks, 60, rng)
    held = _sentences(training_tasks, 10, np.random.default_rng(99))
    before = loss_of(tlm, held, threads=1)
    run = fit(tlm, texts, TrainOptions(epochs=3, batch_size=32, lr=3e-3, threads=1), progress=False)
    assert run["last_loss"] < run["first_loss"]
    assert loss_of(tlm, held, threads=1) < before - 1.0
    # batch_matmul and dense were never in its sentences
    cpu = corpus.targets("cpu")[0]
    for op, shape in (("batch_matmul", dict(batch=3, M=50, N=70, K=30)), ("dense", dict(M=20, N=90, K=45))):
        task = make_task(op, cpu, **shape)
        got = generate(tlm, task, 20, Completions(task.space, set(), rng), rng)
        assert len(got) == 20 and all(make_task(op, cpu, **shape).space.is_valid(s.digits) for s in got)
    # fine-tuning on one configuration makes it the likeliest
    task = make_task("matmul", cpu, M=96, N=160, K=128)
    best = task.space.sample_valid(np.random.default_rng(8), 1)[0]
    fit(tlm, [sentence(task, task.space.config(best))] * 16,
        TrainOptions(epochs=20, batch_size=16, lr=3e-3, schedule="constant", threads=1), progress=False)
    top = generate(tlm, task, 1, Completions(task.space, set(), rng), rng, temperature=0.5)[0]
    assert top.digits == best


def test_tlm_tuner_resumes_from_records(tiny_model, tmp_path):
    _, folder = tiny_model
    task = make_task("matmul", corpus.targets("cpu")[0], M=100, N=300, K=200)
    records = tmp_path / "r.jsonl"
    first = tune_task(task, 6, records, tuner="tlm", batch_size=3, progress=False, build_best=False,
                      tuner_options={"model": folder}, measurer=HashMeasurer())
    assert first.new_trials == 6
    lines = records.read_text().splitlines()
    again = HashMeasurer()
    second = tune_task(task, 10, records, tuner="tlm", batch_size=3, progress=False, build_best=False,
                       tuner_options={"model": folder, "top_k": 3}, measurer=again)
    assert second.new_trials == 4 and again.calls == 4
    after = records.read_text().splitlines()
    assert after[:6] == lines
    configs = [json.dumps(json.loads(x)["config"], sort_keys=True) for x in after]
    assert len(set(configs)) == 10 and all(json.loads(x)["tuner"] == "tlm" for x in after)


def test_pt_tune_with_the_tlm_tuner_builds_the_best_kernel(tiny_model, tmp_path):
    _, folder = tiny_model
    kern = pt.tune("softmax", M=40, N=70, tuner="tlm", model=folder, trials=2, batch_size=2,
                   records=tmp_path / "r.jsonl", progress=False, temperature=0.7, top_k=2)
    x = np.random.default_rng(0).standard_normal((40, 70)).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert np.allclose(kern(x), e / e.sum(axis=1, keepdims=True), atol=1e-5)
    assert [r.tuner for r in kern.tune_result.records] == ["tlm", "tlm"]


def test_bad_models_and_options_get_clear_errors(tiny_model, tmp_path):
    _, folder = tiny_model
    task = make_task("matmul", corpus.targets("cpu")[0], M=100, N=300, K=200)

    def tuner(model, **kw):  # noqa: ANN001, ANN202
        return tune_task(task, 1, None, tuner="tlm", progress=False, build_best=False,
                         tuner_options={"model": model, **kw}, measurer=HashMeasurer())

    with pytest.raises(TuneError, match="needs a trained model"):
        tuner(None)
    with pytest.raises(TuneError, match="does not exist"):
        tuner(tmp_path / "nothing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(TuneError, match="is not a directory"):
        tuner(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TuneError, match="lacks config.json, model.safetensors, tokenizer.json, tlm.json"):
        tuner(tmp_path / "empty")
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(TuneError, match="weights cannot be read"):
        tuner(broken)
    shutil.rmtree(broken)
    shutil.copytree(folder, broken)
    (broken / "tlm.json").write_text("{not json")
    with pytest.raises(TuneError, match="tlm.json cannot be read"):
        tuner(broken)
    other = TLM.create([sentence(task, task.space.config_at(0))], "cpu", TINY, device="cpu")
    other.save(tmp_path / "other")
    mixed = tmp_path / "mixed"
    shutil.copytree(folder, mixed)
    shutil.copy(tmp_path / "other" / "tokenizer.json", mixed / "tokenizer.json")
    with pytest.raises(TuneError, match="another vocabulary"):
        tuner(mixed)
    gpu = make_task("matmul", corpus.targets("cuda")[1], "matmul_tensorcore", M=64, N=64, K=64, dtype="float16")
    with pytest.raises(TuneError, match="trained for cpu targets, not cuda"):
        tune_task(gpu, 1, None, tuner="tlm", progress=False, build_best=False, tuner_options={"model": folder},
                  measurer=HashMeasurer())
    with pytest.raises(TuneError, match="no TLM model is shipped for cuda"):
        tune_task(gpu, 1, None, tuner="tlm", progress=False, build_best=False,
                  tuner_options={"model": "default"}, measurer=HashMeasurer())
    with pytest.raises(TuneError, match="temperature must be a positive number"):
        tuner(folder, temperature=0)
    with pytest.raises(TuneError, match="top_k must be a non-negative integer"):
        tuner(folder, top_k=-1)
    with pytest.raises(TuneError, match="options of tuner='tlm', not of 'random'"):
        pt.tune("softmax", M=8, N=8, tuner="random", model=folder, trials=1, progress=False)


def test_analytical_sentences_are_the_configurations_the_model_ranks_fastest():
    from polytile.tune.tlm.finetune import analytical_sentences
    gpu = make_task("matmul", corpus.targets("cuda")[1], "matmul_tensorcore", M=200, N=300, K=520, dtype="float16")
    cpu = make_task("matmul", corpus.targets("cpu")[0], M=100, N=300, K=200)  # no analytical model: passed over
    texts = analytical_sentences([gpu, cpu], top=3, pool=40, seed=5)
    assert len(texts) == 3
    drawn = gpu.space.sample_valid(np.random.default_rng(5), 40)  # the pool the function drew
    cost = dict(zip(drawn, gpu.predict([gpu.space.config(d).values for d in drawn]), strict=True))
    chosen = [read_sentence(gpu, t).digits for t in texts]
    assert max(cost[d] for d in chosen) <= min(c for d, c in cost.items() if d not in chosen)
    assert len(set(chosen)) == 3


def test_records_target_keys_name_the_targets_they_were_written_for():
    from polytile.tune.tlm.finetune import target_of
    for target in corpus.targets("cpu") + corpus.targets("cuda"):  # GPUs by their datasheet facts
        assert target_of(target.key) == target
    assert target_of("cuda:NVIDIA_H100_80GB_HBM3:sm_90a").sms == 132
    with pytest.raises(TuneError, match="names no target polytile knows"):
        target_of("cuda:x:sm_12")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_gpu_corpus_reaches_its_size_when_small_spaces_fall_short(tmp_path, workers):
    # LLaMA's GPU layers: 25 tasks with 5,163 valid configurations in all, many below their share
    header = corpus.write_corpus(tmp_path / "c.txt", "cuda", 3000, ["llama-7b"], progress=False, workers=workers)
    _, texts = corpus.read_corpus(tmp_path / "c.txt")
    assert len(texts) == header["sentences"] >= 3000 and len(set(texts)) == len(texts)
    assert {"matmul_wgmma", "matmul_tensorcore", "batch_matmul_tensorcore"} <= set(header["templates"])
    assert {t.split(":")[-1] for t in header["targets"]} == {"sm_80", "sm_90a"}
    if workers > 1:  # drawn in processes: as reproducible
        corpus.write_corpus(tmp_path / "d.txt", "cuda", 3000, ["llama-7b"], progress=False, workers=workers)
        assert corpus.read_corpus(tmp_path / "d.txt")[1] == texts


def test_every_implicit_gemm_tile_is_one_word():
    # ResNet-50's 3×3 layer at batch 32 on an H100: igemm_options ranks a warpgroup-MMA tile twice (with
    # two splits); the corpus of GPU sentences failed on it
    from polytile.tune.tlm.sentence import decision_words
    task = make_task("conv2d_igemm", corpus.targets("cuda")[1], "conv2d_igemm_choices", N=32, H=56, W=56, C=64,
                     K=64, R=3, S=3, stride=1, padding=1)
    tiles = next(d for d in task.space.decisions if d.name == "tile").choices
    assert len(tiles) == len(set(tiles)) > 1
    assert decision_words(task.space)


def test_corpus_files_are_checked(tmp_path):
    with pytest.raises(TuneError, match="does not exist"):
        corpus.read_corpus(tmp_path / "none.txt")
    (tmp_path / "c.txt").write_text("hello\n")
    with pytest.raises(TuneError, match="is not a TLM corpus"):
        corpus.read_corpus(tmp_path / "c.txt")
    (tmp_path / "c.txt").write_text(corpus.HEADER + "{}\nop=matmul mr=4\n")
    with pytest.raises(TuneError, match="c.txt:2: not a tensor sentence"):
        corpus.read_corpus(tmp_path / "c.txt")


def test_the_shipped_cpu_model_writes_valid_schedules_for_a_held_out_network():
    from polytile.tune.tlm.model import resolve
    tlm = resolve("default", "cpu", device="cpu")
    assert tlm.kind == "cpu" and 3_000_000 < tlm.parameters < 8_000_000
    assert set(networks.HELD_OUT).isdisjoint(tlm.meta["corpus"]["networks"])
    task = make_task("matmul", corpus.targets("cpu")[1], M=197, N=768, K=768)  # ViT-B/16's projection
    rng = np.random.default_rng(0)
    got = generate(tlm, task, 8, Completions(task.space, set(), rng), rng)
    checker = make_task("matmul", corpus.targets("cpu")[1], M=197, N=768, K=768).space
    assert len({s.digits for s in got}) == 8 and all(checker.is_valid(s.digits) for s in got)


def test_the_shipped_cpu_model_has_a_word_for_every_choice_of_the_cpu_templates():
    """The shipped model is built from the templates as they are: every choice of every CPU template's
    decisions, on a layer of the corpus's networks, is a word of its vocabulary (a template's new or
    renamed decision would be [UNK] to it, drawn at random: the row templates' lanewise, accumulators,
    vectors and row_buffer and most of conv2d_cpu's were, until the model was built again)."""
    from polytile.tune.tlm.model import resolve
    tlm = resolve("default", "cpu", device="cpu")
    layers = corpus.workloads("cpu", tlm.meta["corpus"]["networks"])
    # polytile's own templates (other tests register theirs)
    for template in [t for t in list_templates() if t.kind == "cpu" and t.fn.__module__.startswith("polytile.")]:
        if template.op == "func":  # a plain Func's choices depend on its extents: its decisions at least
            task = example_task(template)
            assert task is None or not tlm.unknown_decisions(task.space), template.name
            continue
        args = next(args for _, op, args in layers if op == template.op)
        task = make_task(template.op, corpus.targets("cpu")[0], template, **args)
        missing = [w for dw in decision_words(task.space) for w in dw.words if w not in tlm.ids]
        assert not missing, (template.name, missing)
    stale = copy.copy(tlm)
    stale.ids = {w: k for w, k in tlm.ids.items() if not w.startswith("lanewise=")}
    softmax = make_task("softmax", corpus.targets("cpu")[0], M=128, N=197)
    assert stale.unknown_decisions(softmax.space) == ["lanewise"]
    with pytest.warns(UserWarning, match="no word for the decisions lanewise of template softmax_cpu"):
        tune_task(softmax, 2, None, tuner="tlm", batch_size=2, progress=False, build_best=False, verify=False,
                  tuner_options={"model": stale}, measurer=HashMeasurer())


@pytest.mark.gpu
def test_training_and_decoding_on_the_gpu(tmp_path, training_tasks):
    rng = np.random.default_rng(6)
    texts = _sentences(training_tasks, 30, rng)
    tlm = TLM.create(texts, "cpu", TINY, device="cuda", words=_words(training_tasks))
    run = fit(tlm, texts, TrainOptions(epochs=3, batch_size=32, lr=3e-3), progress=False)
    assert run["device"].startswith("cuda") and run["last_loss"] < run["first_loss"]
    tlm.save(tmp_path / "m")
    again = TLM.load(tmp_path / "m", device="cuda")
    task = make_task("dense", corpus.targets("cpu")[0], M=20, N=90, K=45)
    got = generate(again, task, 50, Completions(task.space, set(), rng), rng)
    checker = make_task("dense", corpus.targets("cpu")[0], M=20, N=90, K=45).space
    assert len(got) == 50 and all(checker.is_valid(s.digits) for s in got)

"""Search spaces: decisions, configurations (JSON, indices), constraints and resource limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from polytile.target import CPUTarget, CUDATarget
from polytile.tune import ConfigSpace, TemplateConfig, TuneError, make_task
from polytile.tune.space import split_choices


def test_split_choices_factors_and_powers_of_two():
    assert split_choices(12, 2) == ((12, 1), (6, 2), (4, 3), (3, 4), (2, 6), (1, 12))
    three = split_choices(8, 3)
    assert all(a * b * c == 8 for a, b, c in three) and len(three) == 10
    pow2 = split_choices(100, 2, policy="pow2")
    assert [c[1] for c in pow2] == [1, 2, 4, 8, 16, 32, 64] and pow2[-1][0] == 2  # ceil(100 / 64)
    with pytest.raises(TuneError, match="policy"):
        split_choices(8, 2, policy="primes")


def _space(target=None) -> ConfigSpace:
    cfg = TemplateConfig("define", target or CPUTarget(cores=2))
    cfg.split("tile", 64, 3, policy="pow2")
    cfg.knob("unroll", [True, False])
    cfg.reorder("order", ["a", "b", "c"])
    cfg.tag("ann", "x", ["serial", "vectorize"])
    cfg.integer("stages", 1, 4)
    return ConfigSpace(cfg.decisions)


def test_configs_round_trip_through_json_and_indices():
    space = _space()
    assert space.size == len(split_choices(64, 3, "pow2")) * 2 * 6 * 2 * 4
    rng = np.random.default_rng(0)
    for d in space.sample_valid(rng, 20):
        cfg = space.config(d)
        again = space.from_values(json.loads(json.dumps(cfg.to_json())))
        assert again.digits == cfg.digits and again.key == cfg.key
        assert space.config_at(space.index_of(d)).digits == d
    with pytest.raises(TuneError, match="not one of its choices"):
        space.from_values({**space.config_at(0).to_json(), "stages": 9})


def test_knob_features_have_fixed_length_and_differ():
    space = _space()
    rows = np.array(space.sample_valid(np.random.default_rng(1), 30))
    feats = space.knob_features(rows)
    assert feats.shape == (30, len(space.knob_feature_names()))
    assert len({tuple(f) for f in feats}) == 30


def test_constraints_and_resource_limits_discard_configurations():
    task = make_task("matmul", CPUTarget(cores=2, vector_bits=512), M=64, N=64, K=64)
    space = task.space
    bad = space.from_values({**space.config_at(0).to_json(), "mr": 14, "nr_vecs": 4})
    assert "vector_registers" in space.reason_invalid(bad.digits)
    sample = space.sample_valid(np.random.default_rng(0), 200)
    for d in sample:
        v = space.config(d).values
        assert v["mr"] * v["nr_vecs"] + v["nr_vecs"] + 1 <= 32


def test_gpu_resource_limits_come_from_the_target():
    small = CUDATarget(max_threads_per_block=256, shared_per_block=16 * 1024)
    cfg = TemplateConfig("check", small, {})
    cfg.resources(threads_per_block=256, shared_bytes=8 * 1024)
    with pytest.raises(TuneError, match="threads_per_block 512 exceeds"):
        cfg.resources(threads_per_block=512)
    with pytest.raises(TuneError, match="shared_bytes"):
        cfg.resources(shared_bytes=32 * 1024)
    with pytest.raises(TuneError, match="unknown resource"):
        cfg.resources(warps=4)


def test_template_spaces_of_the_operators_are_defined_without_compiling():
    for op, shape in [("matmul", dict(M=512, N=512, K=512)),
                      ("batch_matmul", dict(batch=4, M=64, N=64, K=64)),
                      ("dense", dict(M=64, N=128, K=64)), ("softmax", dict(M=64, N=100)),
                      ("layernorm", dict(M=64, N=100)),
                      ("conv2d", dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, stride=1, padding=1))]:
        task = make_task(op, "cpu", **shape)
        assert task.space.size > 1
        assert task.key.startswith(f"{task.template.name}/{op}(")
        assert task.space.sample_valid(np.random.default_rng(0), 4)


def test_builtin_templates_are_listed_for_each_target_kind():
    from polytile.tune import list_templates
    kinds = {(t.op, t.kind) for t in list_templates()}
    for op in ("matmul", "batch_matmul", "dense", "conv2d", "softmax", "layernorm"):
        assert (op, "cpu") in kinds
    assert ("matmul", "cuda") in kinds and ("conv2d", "cuda") in kinds and ("func", "cpu") in kinds


def test_a_knob_refuses_a_value_given_twice():
    cfg = TemplateConfig("define", CPUTarget(cores=2))
    with pytest.raises(TuneError, match="knob 'threads': the choice 32 is given twice"):
        cfg.knob("threads", [8, 1, 32, 32, 64])


@pytest.mark.parametrize("name,N", [("softmax", 20), ("layernorm", 7), ("softmax", 200), ("layernorm", 511)])
def test_narrow_row_templates_offer_each_width_once(name, N):
    # parts of a warp (1-32 lanes) and blocks of whole warps (32-1024) both hold 32: the narrow rows'
    # template declared it twice where the default was not 32, and TLM's corpus refused the space
    from polytile.tune.tlm.sentence import decision_words
    task = make_task(name, CUDATarget(arch="sm_90a"), M=4096, N=N)
    threads = next(d for d in task.space.decisions if d.name == "threads").choices
    assert len(set(threads)) == len(threads) and 32 in threads
    assert decision_words(task.space)


def _checked_template(cfg: TemplateConfig, op: object) -> None:
    """Every kind of decision and a constraint over all of them (the check reads their values)."""
    tile = cfg.split("tile", 16, 2)
    width = cfg.knob("width", [8, 2, 4])
    order = cfg.reorder("order", ["i", "j"])
    ann = cfg.tag("ann", "j", ["serial", "unroll"])
    stages = cfg.integer("stages", 1, 3, default=2)
    cfg.require((tile[1] * stages + (width == 4) + order.index("i") + (ann == "unroll")) % 3 != 0, "odd rule")
    cfg.schedule(op)


def test_checks_give_each_configuration_its_own_values():
    """A check runs the template with the configuration's values without making the choices again
    (``TemplateConfig`` in check mode): its verdict is the constraint evaluated on those values, for
    every configuration."""
    from polytile.tune.space import InvalidConfig, _StopTemplate
    target = CPUTarget(cores=2)

    def run(mode: str, values: dict | None = None) -> TemplateConfig:
        cfg = TemplateConfig(mode, target, values)
        try:
            _checked_template(cfg, None)
        except _StopTemplate:
            pass
        return cfg

    def check(values: dict) -> str | None:
        try:
            run("check", values)
        except InvalidConfig as err:
            return str(err)
        return None

    space = ConfigSpace(run("define").decisions, check)
    verdicts = set()
    for k in range(space.size):
        c = space.config_at(k)
        v = c.values
        ok = (v["tile"][1] * v["stages"] + (v["width"] == 4) + v["order"].index("i") + (v["ann"] == "unroll")) % 3 != 0
        assert space.is_valid(c.digits) == ok, v
        verdicts.add(ok)
    assert verdicts == {True, False}


def test_first_choices_keep_each_value_once_by_type():
    """The GPU templates' ``_first`` (default first, each choice once, 1 and True apart) against the
    pairwise comparison it replaced, on random lists with unhashable values among them."""
    from polytile.tune.templates.cuda import _first

    def reference(default, choices):
        out = []
        for c in ([] if default is None else [default]) + list(choices):
            if not any(type(c) is type(o) and c == o for o in out):
                out.append(c)
        return out

    pool = [0, 1, 2, True, False, 1.0, "tma", "threads", None, (1, 2), (1, 2.0), [1], [1], [True]]
    rng = np.random.default_rng(0)
    for _ in range(300):
        choices = [pool[k] for k in rng.integers(0, len(pool), rng.integers(0, 8))]
        default = pool[rng.integers(0, len(pool))]
        got = _first(default, choices)
        want = reference(default, choices)
        assert got == want and [type(x) for x in got] == [type(x) for x in want], (default, choices)


def test_target_facts_are_kept_per_target():
    """``features`` and ``capability`` are computed once per (frozen) target: another architecture made
    from it has its own, and a target read back from a pickle the same."""
    import dataclasses
    import pickle
    h100 = CUDATarget()
    assert h100.has("wgmma") and h100.capability == 90
    a100 = dataclasses.replace(h100, arch="sm_80")
    assert not a100.has("wgmma") and a100.has("cp.async") and a100.capability == 80
    again = pickle.loads(pickle.dumps(h100))
    assert again == h100 and again.features == h100.features
    avx = CPUTarget(cores=2, flags=("avx2", "fma"))
    assert avx.has("avx2") and not CPUTarget(cores=2).has("avx2")

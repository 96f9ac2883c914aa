"""The heuristic table, forced kernels, configuration validation and explain (CPU only)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import warnings

import numpy as np
import pytest

import fastmm
from fastmm import _plan
from fastmm.kernels import configs
from fastmm.kernels.configs import RegTile, Smem, Variant, WarpTile

H100 = _plan.Device()


def choose(m, n, k, batch=1, **kw):
    return _plan.choose(_plan.Problem(m, n, k, batch, **kw), H100)


def test_names_are_derived_from_data():
    assert RegTile(128, 128, 8, 8, 8).name == "regtile_128x128x8_8x8"
    assert Smem(16).name == "smem_16"
    assert RegTile().binary_name(Variant(True, False, 1)) == "regtile_128x128x8_8x8_tn_v1"
    assert Smem(32).binary_name(Variant(True, True, 1)) == "smem_32"   # layout read at run time
    assert len({c.name for c in configs.CONFIGS}) == len(configs.CONFIGS)


def test_unknown_kernel_lists_valid_names():
    with pytest.raises(KeyError, match="valid names: auto, naive, smem, regtile"):
        choose(8, 8, 8) if False else _plan.choose(_plan.Problem(8, 8, 8), H100, "fast")
    with pytest.raises(KeyError, match="regtile_128x128x8_8x8"):
        with fastmm.use_kernel("nope"):
            pass


@pytest.mark.parametrize("m,n,k,batch,rule", [
    (0, 5, 5, 1, "empty"), (5, 5, 0, 1, "empty"), (5, 5, 5, 0, "empty"),
    (16, 16, 16, 1, "small"), (1000, 1, 1000, 1, "small"), (64, 64, 64, 1, "small"), (8, 4, 3, 64, "small"),
    (65536, 16, 16, 1, "short-k"), (65536, 16, 17, 1, "few-columns-tiles"), (65536, 16, 385, 1, "few-columns"),
    (65536, 4, 17, 1, "few-columns"), (10000, 1, 1000, 1, "few-columns"),
    (1, 4096, 4096, 1, "few-columns"), (1700, 170, 17, 1, "tiled"), (16, 17, 8192, 1, "few-columns"),
    (17, 4096, 4096, 1, "narrow-tiles"), (24, 48, 65536, 1, "split-k"), (20, 40, 4200, 1, "wide-few-columns"), (256, 256, 256, 1, "tiled"), (128, 128, 65536, 1, "split-k"),
    (128, 128, 65536, 2, "split-k-idle"), (128, 128, 65536, 9, "split-k-idle"), (128, 128, 65536, 33, "tiled"), (96, 96, 511, 4, "tiled"), (96, 96, 512, 4, "split-k-idle"), (512, 512, 4096, 1, "split-k-mid"), (768, 768, 768, 1, "split-k-mid"), (64, 64, 16384, 1, "split-k"),
    (1, 1, 1 << 20, 1, "few-columns"), (32, 32, 1 << 20, 1, "split-k"),
    (4096, 4096, 4096, 1, "tiled"), (1024, 1024, 1024, 1, "tiled"), (256, 256, 256, 64, "tiled"),
])
def test_rules_fire_in_order(m, n, k, batch, rule):
    assert choose(m, n, k, batch).rule == rule


def test_tiled_rule_fills_the_gpu():
    # K from 1024 in whole 16-deep K-tiles, any layout: the 128x256 tile on its sub-tile loop, summing K in runs of 512
    # (cuBLAS's accuracy; one run over all of K had up to twice its error, and was under 2% faster).
    assert choose(8192, 8192, 8192).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"
    assert choose(2048, 2048, 2048).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"
    # K not a multiple of 16: the same loop, which reads the last K % 16 terms after it.
    assert choose(8192, 8192, 8184).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512_ragged"
    # K short of the runs: the unrolled tiles, 32 deep from two waves.
    for b_t in (False, True):
        assert choose(8192, 8192, 8192, b_t=b_t, a_t=True).name == _plan.tiles.WT256_SLICES
    assert choose(4096, 4096, 4096, b_t=True).name == _plan.tiles.WT256_SLICES
    for m, n, k, a_t in ((2048, 2048, 2048, True), (4096, 4096, 4080, True), (8192, 8192, 8176, False)):
        assert choose(m, n, k, a_t=a_t).name == _plan.tiles.WT256_SLICES
    assert choose(16384, 16384, 64).name == "warptile_128x256x32_64x64_8x16_s4_spread"
    assert choose(2048, 2048, 2040).name == _plan.tiles.WT256_SLICES_RAGGED   # one wave of 128 tiles, a ragged K
    assert choose(2048, 2048, 1000).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_ragged"  # ... short of runs
    # ... or, K a multiple of 16, the 16-deep tile looping over whole K-tiles.
    assert choose(256, 256, 256, batch=64).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16"
    assert choose(2048, 2048, 2032).name == _plan.tiles.WT256_SLICES
    assert choose(1280, 1280, 512).name == "warptile_128x64x16_32x64_8x8_s4_sub8"  # 50 tiles of 128x256: too few
    # 72 tiles: over half the SMs, with per-tile sums below 3/4 of a wave (then split-K over K takes the product)
    assert _plan.tiles._fill(_plan.Problem(768, 768, 4096), H100) == "warptile_128x64x16_32x64_8x8_s4_tsum"
    assert choose(768, 768, 4096).rule == "split-k-mid"
    assert choose(512, 512, 512).name == "warptile_64x64x16_32x32_8x4_s4_tsum4"     # 32 tiles of 128x64: too few
    # Padding: 4097^3 on 128x256 tiles would compute 9% outside C; 128x64 tiles waste 4.5% (the ragged-edge rule
    # takes such products first, see below).
    assert _plan.tiles._fill(_plan.Problem(4097, 4097, 4097), H100) == "warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"
    assert choose(65536, 128, 128).name == "warptile_128x64x16_32x64_8x8_s4"      # half of a 256-wide tile idle
    assert choose(2048, 1024, 1024).name == "warptile_128x64x16_32x64_8x8_s4_sub8"  # 256 tiles: under a wave
    assert choose(2048, 1024, 2048).name == "warptile_128x64x16_32x64_8x8_s3_sub8_f512"  # ... K from 1536: in runs
    assert choose(3072, 3072, 3072).name == "warptile_128x64x16_32x64_8x8_s4"      # 2.9 waves: unrolled
    assert choose(3072, 3072, 6144).name == "warptile_128x64x16_32x64_8x8_s3_sub8_f512"  # ... K past 4096: in runs
    assert choose(2560, 2560, 3072).name == "warptile_128x64x16_32x64_8x8_s3_sub8_f512"  # 2.4 waves, K from 1536
    assert choose(4096, 48, 1024).name == "warptile_64x64x16_32x32_8x4_s4_tsum4"    # narrow: the smallest tile
    assert choose(768, 768, 256).name == "warptile_128x64x16_32x64_8x8_s4_tsum"    # under a wave: tile sums
    assert choose(1024, 1024, 1024).name == "warptile_128x64x16_32x64_8x8_s4_sub8"
    assert choose(1000, 1000, 1000).name == "warptile_128x64x16_32x64_8x8_s4"  # a short ragged K: unrolled
    assert choose(1000, 1000, 1100).name == "warptile_128x64x16_32x64_8x8_s4_sub8_ragged"  # ... from K = 1024, the loop
    # A ragged last wave: 3000^3 is 2.2 waves of 128x256 tiles (27% of the SMs' time idle), 2.85 of 128x64.
    assert _plan.wave_efficiency(_plan.Problem(3000, 3000, 3000), _plan.tiles.get_config(
        "warptile_128x256x16_64x64_8x16_s4_spread"), _plan.Device()) == pytest.approx(288 / 396)
    assert choose(3000, 3000, 3000).name == "warptile_128x64x16_32x64_8x8_s4"      # 3000 = 187.5 x 16
    assert choose(6144, 6144, 6144).name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"  # 8.7 waves: 97% busy
    # A^T.B (A m-contiguous, both operands copied 16 bytes at a time): the 16-deep stages, K in runs of 512.
    at = _plan.choose(_plan.Problem(2048, 2048, 2048, a_t=True))
    assert at.name == _plan.tiles.WT256_SLICES and at.variant.a_t
    # A GPU with fewer SMs fills up with larger tiles sooner.
    few = _plan.choose(_plan.Problem(1024, 1024, 1000), _plan.Device(sm_count=16))
    assert few.name == "warptile_128x256x32_64x64_8x16_s4_spread"


def test_split_k_slices_are_about_512_deep_and_fill_a_wave():
    c = choose(128, 128, 65536)
    assert c.name == "warptile_128x64x16_32x64_8x8_s4_sub8" and c.splits == 128  # 2 tiles x 128: a wave of 396
    assert choose(64, 64, 4096).splits == 32   # one tile: two blocks an SM on 132 SMs (balanced_splits), 128 deep
    assert choose(4096, 4096, 4096).splits == 1
    # Outputs that hold two 128x256 tiles or more take them (on the 16-deep loop, summing K in runs of 512), in one wave
    # of even slices (2 x 64, 8 x 16 blocks); an output that 128x256 tiles would pad by a quarter takes 128x64 ones.
    loop16 = "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"
    assert (choose(256, 256, 65536).name, choose(256, 256, 65536).splits) == (loop16, 64)
    assert (choose(512, 512, 32768).name, choose(512, 512, 32768).splits) == (loop16, 16)
    assert choose(384, 384, 65536).name == "warptile_128x64x16_32x64_8x8_s4_sub8"
    # ... unless K has no even cut into 16-deep steps: then slices about 512 deep, as on 64x64 tiles.
    assert choose(300, 300, 65537).splits == 128
    assert choose(64, 64, 262144).splits == 528                   # one wave of 64x64 blocks, slices of 496
    # Products with an output side of 17 to 31 and a long K split for accuracy too: on the narrow tiles (32 rows or
    # columns: less padding than 64x64's) against 64 or more of the other side, as many slices as balance the SMs.
    narrow = choose(8192, 24, 8192)
    assert (narrow.rule, narrow.name, narrow.splits) == ("narrow-tiles", "warptile_128x32x16_32x32_8x4_s4_tsum4", 4)
    narrow = choose(24, 8192, 8192)
    assert (narrow.rule, narrow.name, narrow.splits) == ("narrow-tiles", "warptile_32x128x16_32x32_8x4_s4_tsum4", 4)
    narrow = choose(24, 48, 65536)
    assert (narrow.rule, narrow.name, narrow.splits) == ("split-k", "warptile_64x64x16_32x32_8x4_s4_tsum4", 256)
    assert "split-K into 128 slices" in fastmm.explain((128, 65536), (65536, 128))


@pytest.mark.parametrize("m,n,k,splits", [
    (896, 896, 896, 4), (1536, 1536, 1536, 4), (1792, 1792, 1792, 2), (768, 3072, 768, 4), (512, 512, 2048, 4),
    (384, 384, 2048, 16),
    # Small outputs (0.5 to 1.25 64x64 tiles per SM): 64x64 tile sums, slices 128 deep or more, at most 8.
    (768, 768, 768, -6), (640, 640, 1024, -8), (768, 768, 512, -4), (768, 768, 1536, -8), (640, 640, 768, -6),
    (576, 576, 1024, -8),
])
def test_short_k_splits_where_the_tiles_leave_sms_idle(m, n, k, splits):
    c = choose(m, n, k)
    name = "warptile_64x64x16_32x32_8x4_s4_tsum4" if splits < 0 else "warptile_128x64x16_32x64_8x8_s4"
    splits = abs(splits)
    assert (c.rule, c.name, c.splits) == ("split-k-mid", name, splits)
    assert k % (16 * splits) == 0  # whole 16-deep steps in every slice: no uneven last slice
    assert f"split-K into {splits} slices" in fastmm.explain((m, k), (k, n))


@pytest.mark.parametrize("m,n,k,batch", [
    (1024, 1024, 1024, 1), (2048, 2048, 2048, 1), (2048, 2048, 512, 1), (640, 640, 640, 1),  # SMs busy, or small
    (512, 512, 512, 1), (768, 768, 768 + 8, 1), (768, 768, 768, 2),  # no even 16-deep split; batched
])
def test_short_k_stays_whole_where_a_split_measured_slower_or_cannot_be_even(m, n, k, batch):
    assert choose(m, n, k, batch).splits == 1


@pytest.mark.parametrize("m,n,k,rule,splits", [
    (146, 117, 717, "split-k-idle", 5),     # 6 tiles: slices at least 128 deep, as many as fill a wave
    (208, 897, 903, "split-k-idle", 4),     # 60 tiles: 240 blocks, two an SM (3, 4 and 7 measured within 1%)
    (1840, 186, 757, "split-k-idle", 3),    # 87 tiles, the shorter side 186: 261 blocks (0.98x cuBLAS; 5: 0.86x)
    (56, 388, 841, "split-k-idle", 6),
    (146, 117, 500, "tiled", 1),            # K under 512: a second launch cost more than it saved
    (428, 1091, 642, "tiled", 1),           # the shorter side past 256: 126 tiles, split measured slower
    (640, 640, 1000, "tiled", 1),           # 100 tiles, square: small products stay whole
    (200, 47, 1000, "narrow-few-columns", 1),  # under 48: the few-column kernel
    (150, 3000, 700, "tiled", 3),           # 141 tiles: every SM has a block (the tiled rule's, just past one a SM)
])
def test_split_k_idle_takes_few_tiles_from_k_512_on_outputs_48_to_256_wide(m, n, k, rule, splits):
    """Below K = 1024, split-k-idle takes the products whose 64x64 tiles leave SMs without a block where the output's
    shorter side is 48 to 256, in slices at least 128 deep; each slice sums a short run."""
    c = choose(m, n, k)
    assert (c.rule, c.splits) == (rule, splits), c
    if splits > 1:
        depth, slices, rest = _plan.split_cut(k, splits, c.config)
        assert depth >= 128 and rest == 0 and _plan.serial_run(c, _plan.Problem(m, n, k), H100) <= 64


@pytest.mark.parametrize("m,n,k,batch,layout,splits", [
    (102, 4369, 905, 1, "c", 3),      # 138 64x64 tiles on 132 SMs: six SMs with two blocks set the time (0.66x -> 0.83x)
    (165, 3498, 435, 1, "b_t", 3),    # 165 tiles (0.86x -> 1.09x)
    (118, 5632, 884, 1, "c", 3),      # 2 x 88 = 176 tiles, a third of the SMs with two: the last it takes
    (118, 5633, 884, 1, "c", 1),      # 178 tiles
    (102, 4224, 884, 1, "c", 1),      # 132 tiles: one on every SM
    (102, 4225, 884, 1, "c", 3),      # 134
    (102, 4369, 383, 1, "c", 1),      # K under 384: the second launch costs more than the balance gains
    (51, 4369, 905, 2, "c", 1),       # a batch of two: 138 tiles, its items one launch
])
def test_tiled_splits_four_warp_tiles_just_past_one_block_per_sm(m, n, k, batch, layout, splits):
    """Below K = 1024, a single product whose four-warp tiles give every SM a block and up to a third of them a
    second runs K in 3 slices, 3 or 4 blocks on each SM (docs/kernels/heuristic.md, section 'tiled: just past one block
    per SM'); each slice then sums a third of K."""
    problem = _plan.Problem(m, n, k, batch, a_t=layout in ("a_t", "fortran"), b_t=layout in ("b_t", "fortran"))
    c = _plan.choose(problem, H100)
    assert c.rule == "tiled" and c.config.name in _plan.tiles.SMALL_TILES, c
    assert c.splits == splits, (c, problem.tiles(c.config))
    if splits > 1:
        assert _plan.serial_run(c, problem, H100) <= -(-k // 3)
        assert "split-K into 3 slices" in fastmm.explain((m, k), (k, n))


@pytest.mark.parametrize("m,n,k,peel", [
    (4097, 4097, 4097, (1, 1)), (8193, 8193, 8193, (1, 1)), (4100, 4100, 4100, (4, 4)), (4097, 4096, 4096, (1, 0)),
    (4096, 4112, 4096, (0, 16)), (2049, 2049, 2049, (1, 1)),
])
def test_ragged_edges_of_large_products_run_as_few_column_products(m, n, k, peel):
    problem = _plan.Problem(m, n, k, aligned=False)
    c = _plan.choose(problem, H100)
    if m * n * k >= _plan.table._PAD_MIN_MACS:
        # First copied to aligned rows, K padded to whole 16-deep K-tiles (aligned-copy); the copies' product peels,
        # its interior on the 16-deep loop that sums K in runs of 512 (cuBLAS's accuracy on these shapes).
        assert (c.rule, c.pad) == ("aligned-copy", True)
        problem = _plan.aligned_copies(problem)
        assert (problem.k, problem.aligned, problem.runs) == (-(-k // 16) * 16, True, True)
        c = _plan.choose(problem, H100)
        assert c.name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"
    assert (c.rule, c.peel, c.splits) == ("ragged-edge", peel, 1)
    interior = _plan.choose(_plan.interior(problem, peel), H100)
    assert interior.rule == "tiled" and c.name == interior.name
    if k % 16 and not problem.aligned:  # scalar loads and a ragged K: the 16-deep loop's twin, in runs of 512
        assert interior.name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512_ragged"
    text = fastmm.explain((m, k), (k, n))
    assert f"on the {m - peel[0]}x{n - peel[1]} interior; the last " in text
    for count, side, edge in ((peel[1], "columns", (m - peel[0], peel[1])), (peel[0], "rows", (peel[0], n))):
        if count:  # each edge planned as a product of its own, and named so
            edge_plan = _plan.choose(dataclasses.replace(problem, m=edge[0], n=edge[1]), H100)
            assert f"the last {count} {side} on {edge_plan.name}" in text
        else:
            assert f" {side} on " not in text


def test_explain_of_a_peeled_product_names_its_interiors_split_and_counts_its_blocks():
    """2329x1160x17740: the last 8 columns peeled; the interior, planned as a product of its own, splits K in 12 (the
    runtime runs it so): explain says so, and its grid counts the slices' blocks (it printed one slice's)."""
    problem = _plan.Problem(2329, 1160, 17740)
    c = _plan.choose(problem, H100)
    inside = _plan.interior(problem, c.peel)
    inner = _plan.choose(inside, H100)
    assert (c.rule, c.peel, c.splits, inner.splits) == ("ragged-edge", (0, 8), 1, 12)
    text = fastmm.explain((2329, 17740), (17740, 1160))
    assert "on the 2329x1152 interior, split-K into 12 slices 1479 deep (the last 1471); the last 8 columns on " in text
    assert f"grid    {inside.blocks(inner.config) * 12} blocks of 128 threads" in text


def test_explain_plans_every_part_of_a_product_in_the_precision_it_was_given():
    """explain(precision=...) plans as matmul(precision=...) runs, in that precision's block: a peeled product's
    interior, planned on its own, takes it too (inside a 'high' block it was planned in 'high': 3xTF32 tiles)."""
    shapes = ((2329, 17740), (17740, 1160))
    alone = fastmm.explain(*shapes, precision="highest")
    with fastmm.matmul_precision("high"):
        assert fastmm.explain(*shapes, precision="highest") == alone
    assert "interior, split-K" in alone and "mode    highest" in alone


@pytest.mark.parametrize("m,n,k,batch", [
    (4113, 4113, 4113, 1),   # 17 rows past 4096: more than a few-column product takes
    (4097, 4097, 4097, 2),   # batched
    (2047, 2049, 2047, 1),   # under 2^33 multiply-adds
    (4097, 20, 4097, 1),     # narrow
    (4096, 4096, 4097, 1),   # only K ragged: every tile is whole
    (1537, 1537, 4097, 1),   # 2^33 multiply-adds, but the interior's 72 tiles of 128x256 would leave SMs idle
])
def test_ragged_edges_stay_where_peeling_does_not_apply(m, n, k, batch):
    assert choose(m, n, k, batch, aligned=False).rule != "ragged-edge"


def test_variant_follows_layout_and_alignment():
    c = choose(4097, 4097, 4097, aligned=False, a_t=True)
    assert c.variant == Variant(True, False, 1)
    assert c.config.binary_name(c.variant).endswith("_tn_v1")


def test_forcing_by_argument_family_and_context():
    assert _plan.choose(_plan.Problem(4096, 4096, 4096), H100, "smem").name == "smem_32"
    assert _plan.choose(_plan.Problem(40, 40, 4096), H100, "smem").name == "smem_16"
    assert _plan.choose(_plan.Problem(8, 8, 8), H100, "regtile").name == "regtile_64x64x8_8x8"
    assert _plan.choose(_plan.Problem(8192, 8192, 8192), H100, "regtile").name == "regtile_128x128x8_8x8"
    assert _plan.choose(_plan.Problem(8, 8, 8), H100, "warptile").name == "warptile_64x64x8_32x32_8x4_s4_cstage"
    assert _plan.choose(_plan.Problem(64, 64, 64), H100, "naive").rule == "forced"
    with fastmm.use_kernel("regtile_128x64x8_8x8"):
        assert choose(64, 64, 64).name == "regtile_128x64x8_8x8"
        with fastmm.use_kernel("naive"):
            assert choose(64, 64, 64).name == "naive_32x8"
        assert choose(64, 64, 64).name == "regtile_128x64x8_8x8"
    assert choose(64, 64, 64).rule != "forced"
    # An explicit kernel= beats the context.
    with fastmm.use_kernel("naive"):
        assert _plan.choose(_plan.Problem(64, 64, 64), H100, "smem_16").name == "smem_16"


def test_validation_gives_numbers():
    with pytest.raises(ValueError, match=r"needs 64.0 KiB of shared memory per block; the device allows 48.0 KiB"):
        configs.validate(RegTile(256, 256, 16, 16, 16))
    with pytest.raises(ValueError, match=r"needs 2048 threads per block; the device allows 1024"):
        configs.validate(RegTile(256, 256, 8, 4, 8))
    with pytest.raises(ValueError, match=r"multiples of 4"):
        configs.validate(RegTile(128, 128, 6, 8, 8))
    with pytest.raises(ValueError, match=r"needs 255 registers x 256 threads = 65280 registers per block; the "
                                         r"device has 32768"):
        configs.validate(RegTile(), max_regs_per_block=32768, regs_per_thread=255)
    with pytest.raises(ValueError, match=r"evenly in 4-vectors"):
        configs.validate(RegTile(64, 64, 8, 4, 4))
    with pytest.raises(ValueError, match=r"needs 16.0 KiB.*allows 8.0 KiB per block without opt-in"):
        _plan.choose(_plan.Problem(4096, 4096, 4096), _plan.Device(max_smem_per_block=8 * 1024), "regtile")
    # (The table's 196 KiB tile gives way to its 98 KiB form on a smaller GPU; below that, nothing to give.)
    with pytest.raises(ValueError, match=r"needs 98.0 KiB.*allows 64.0 KiB per block \(with opt-in\)"):
        _plan.choose(_plan.Problem(4096, 4096, 4096), _plan.Device(max_smem_optin=64 * 1024))
    with pytest.raises(ValueError, match=r"needs 196.0 KiB.*allows 64.0 KiB per block \(with opt-in\)"):
        _plan.choose(_plan.Problem(4096, 4096, 4096), _plan.Device(max_smem_optin=64 * 1024), _plan.tiles.WT256_LOOP)


def test_warptile_configurations_are_checked():
    w = WarpTile(128, 256, 32, 64, 64, 8, 16, 4, 1, spread=True)
    assert w.name == "warptile_128x256x32_64x64_8x16_s4_spread" and w.threads == 256
    assert w.smem_bytes == 4 * 32 * (128 + 4 + 256 + 4) * 4   # four stages of padded A and B slices
    assert WarpTile(64, 64, 16, 32, 32, 8, 4, 4, 4).name == "warptile_64x64x16_32x32_8x4_s4"   # copies in one burst
    assert WarpTile(64, 64, 16, 32, 32, 8, 4, 4, 4, tile_sums=True).name == "warptile_64x64x16_32x32_8x4_s4_tsum"
    assert WarpTile(tile_sums=True).macros(Variant())["TILE_SUMS"] == 1 and WarpTile().macros(Variant())["SPREAD"] == 0
    # Sums per run of 4 K-tiles: named by the run, which the kernel reads as TILE_SUMS.
    assert WarpTile(64, 64, 16, 32, 32, 8, 4, 4, 4, tile_sums=4).name == "warptile_64x64x16_32x32_8x4_s4_tsum4"
    assert WarpTile(tile_sums=4).macros(Variant())["TILE_SUMS"] == 4
    with pytest.raises(ValueError, match=r"tile_sums counts K-tiles per partial sum \(0: none\), not -1"):
        configs.validate(WarpTile(tile_sums=-1))
    assert w.binary_name(Variant(False, True, 1)) == "warptile_128x256x32_64x64_8x16_s4_spread_nt_v1"
    with pytest.raises(ValueError, match=r"has 16 threads, not a warp's 32"):
        configs.validate(WarpTile(128, 128, 16, 32, 32, 8, 8))
    with pytest.raises(ValueError, match=r"tiles must nest"):
        configs.validate(WarpTile(128, 128, 16, 48, 64, 8, 8))
    with pytest.raises(ValueError, match=r"at least 2 stages"):
        configs.validate(WarpTile(stages=1))
    with pytest.raises(ValueError, match=r"BK of 8"):
        configs.validate(WarpTile(bk=12))
    # Two warps of 64x64 over a 128-wide side: a 4-byte copy pass of 64 threads covers half a row (pipeline.cuh's P_K
    # would be 0, and nvcc divides by it).
    with pytest.raises(ValueError, match=r"64 threads cannot copy 128-wide rows in whole passes"):
        configs.validate(WarpTile(64, 128, 16, 64, 64, 8, 16, 4, 4))
    with pytest.raises(ValueError, match=r"needs 200 registers x 256 threads = 51200"):
        configs.validate(WarpTile(), max_regs_per_block=32768, regs_per_thread=200)
    # The sub-tile loop: sub_k divides BK, holds whole passes of copies, and leaves tile sums alone.
    loop = WarpTile(128, 256, 32, 64, 64, 8, 16, 4, 1, spread=True, sub_k=8)
    assert loop.name == "warptile_128x256x32_64x64_8x16_s4_spread_sub8" and loop.macros(Variant())["SUB_K"] == 8
    assert WarpTile().macros(Variant())["SUB_K"] == 0
    with pytest.raises(ValueError, match=r"sub_k 12 must divide BK \(32\)"):
        configs.validate(WarpTile(128, 256, 32, 64, 64, 8, 16, 4, 1, sub_k=12))
    with pytest.raises(ValueError, match=r"sub_k 4 must divide BK \(32\) and be a multiple of 8"):
        configs.validate(WarpTile(128, 256, 32, 64, 64, 8, 16, 4, 1, sub_k=4))   # a transposing pass is 8 rows
    with pytest.raises(ValueError, match=r"sub_k and tile_sums cannot be combined"):
        configs.validate(WarpTile(128, 64, 16, 32, 64, 8, 8, 4, 2, tile_sums=True, sub_k=8))
    # Partial sums: runs of whole K-tiles on the sub-tile loop; their slots in shared memory only where K makes runs.
    runs = WarpTile(128, 256, 16, 64, 64, 8, 16, 4, 1, spread=True, sub_k=16, flush=512)
    assert runs.name == "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512" and runs.macros(Variant())["FLUSH"] == 512
    stages = 4 * 16 * (128 + 256 + 8) * 4
    assert runs.shared_for(512) == stages and runs.shared_for(528) == runs.smem_bytes == stages + 256 * 128 * 4
    assert runs.smem_bytes <= 227 * 1024  # validate() at import: it fits the opt-in limit
    assert all(c.shared_for(1 << 20) == c.smem_bytes for c in configs.CONFIGS + configs.AUXILIARY)  # every launch asks
    with pytest.raises(ValueError, match=r"flush 520 must be a multiple of BK \(16\) on a sub-tile loop"):
        configs.validate(WarpTile(128, 256, 16, 64, 64, 8, 16, 4, 1, sub_k=16, flush=520))
    with pytest.raises(ValueError, match=r"flush 512 must be a multiple of BK \(16\) on a sub-tile loop"):
        configs.validate(WarpTile(128, 64, 16, 32, 64, 8, 8, 4, 3, flush=512))  # no loop: no runs
    with pytest.raises(ValueError, match=r"KiB of shared memory per block"):
        configs.validate(WarpTile(128, 256, 32, 64, 64, 8, 16, 4, 1, sub_k=8, flush=512))  # 32-deep stages + slots
    # The loop for any K and any block: a configuration of its own (the whole-K interior loop's code stays as tuned);
    # blocks across C's edges on it where registers allow (not 128x256 tiles copying B^T transposing: they spilled).
    ragged = dataclasses.replace(runs, ragged=True)
    assert ragged.name == runs.name + "_ragged" and ragged.macros(Variant())["RAGGED"] == 1
    assert runs.macros(Variant())["RAGGED"] == 0 and ragged.smem_bytes == runs.smem_bytes
    assert ragged.loops_edges(Variant(b_t=False)) and not ragged.loops_edges(Variant(b_t=True))
    assert not runs.loops_edges(Variant()) and configs.WT128x64_RUNS_RAGGED.loops_edges(Variant(b_t=True))
    with pytest.raises(ValueError, match=r"ragged extends the sub-tile loop to any K and to blocks across C's edges: "
                                         r"it needs sub_k > 0"):
        configs.validate(WarpTile(128, 64, 16, 32, 64, 8, 8, 4, 3, ragged=True))


def test_explain_names_kernel_and_rule():
    text = fastmm.explain((4096, 4096), (4096, 4096))
    assert "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512_nn_v4" in text and "rule    tiled" in text
    a = np.zeros((1300, 1200), np.float32)
    assert "warptile" in fastmm.explain(a, a.T) and "float32" in fastmm.explain(a, a.T)
    assert "CuPy" in fastmm.explain(a.astype(np.float64), a.T)
    with pytest.raises(ValueError, match="mismatch in its core dimension 0"):
        fastmm.explain(a, a)
    assert "forced" in fastmm.explain((8, 8), (8, 8), kernel="naive")


def test_explain_on_the_command_line():
    out = subprocess.run([sys.executable, "-m", "fastmm", "explain", "1000", "1000", "1000"],
                         capture_output=True, text=True, check=True).stdout
    assert "1000x1000x1000" in out and "kernel  warptile" in out


def test_strided_views_plan_without_copies():
    a = np.zeros((256, 512), np.float32)
    text = fastmm.explain(a[::-1, 1:257], a[:256, :256].T)
    assert "note" not in text
    # A device array (here a stand-in with CuPy's attributes) with no unit-stride axis is copied first.
    class DeviceView:
        shape, strides, dtype, ndim = (128, 256), (4096, 8), np.dtype(np.float32), 2
        data = type("ptr", (), {"ptr": 1 << 20})

    text = fastmm.explain(DeviceView(), a[:256, :256])
    assert "operand a has no unit-stride axis and is copied first" in text


def test_tuned_entries_override_the_table(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("FASTMM_CACHE_DIR", str(tmp_path))
    device = _plan.Device(name="Test GPU 9000", driver_version=13000)
    path = _plan.tune_cache_path(device)
    assert path.parent.parent == tmp_path and "Test-GPU-9000-sm_90-drv13000-fastmm" in path.name
    problem = _plan.Problem(2500, 2500, 2500, aligned=False)
    assert _plan.tune_bucket(problem) == "3072x3072x3072_nn_v1"
    _plan.reload_tuned()
    # no cache yet: the table (1.5 waves of 128x64 tiles on K from 1536: K in runs)
    assert _plan.choose(problem, device).name == "warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"entries": {"3072x3072x3072_nn_v1": {
        "kernel": "regtile_64x64x8_8x8", "tflops": 35.6, "heuristic": "regtile_128x128x8_8x8",
        "heuristic_tflops": 33.2}}}))
    _plan.reload_tuned()
    try:
        c = _plan.choose(problem, device)
        assert c.name == "regtile_64x64x8_8x8" and c.rule == "tuned" and "35.6 TFLOP/s against 33.2" in c.reason
        assert _plan.choose(problem, device, tuned=False).rule == "tiled"
        assert _plan.choose(problem, device, "regtile_128x64x8_8x8").rule == "forced"   # forcing still wins
        aligned = _plan.Problem(4096, 4096, 4096)                                        # another class: the table
        assert _plan.choose(aligned, device).rule == "tiled"
        # A peeled product's plan is not one configuration: not overridden (its interior is planned on its own),
        # and neither is a product on aligned copies.
        assert _plan.choose(_plan.Problem(4097, 4097, 4096), device).rule == "ragged-edge"
        assert _plan.choose(_plan.Problem(4097, 4097, 4097, aligned=False), device).rule == "aligned-copy"
        assert _plan.choose(aligned, device).rule == "tiled"
        long_k = _plan.Problem(128, 128, 65536)
        path.write_text(json.dumps({"entries": {_plan.tune_bucket(long_k): {
            "kernel": "naive_32x8", "tflops": 1, "heuristic": "x", "heuristic_tflops": 1}}}))
        _plan.reload_tuned()
        assert _plan.choose(long_k, device).rule == "split-k"                            # not overridden
        path.write_text("{ not json")
        _plan.reload_tuned()
        assert _plan.choose(problem, device).rule == "tiled"                             # unreadable: ignored
    finally:
        path.unlink()
        _plan.reload_tuned()


def test_explain_never_converts_device_arrays_to_host():
    class DeviceOnly:  # like a CuPy array: shape, strides, dtype, data.ptr, and no implicit host conversion
        shape, strides, dtype, ndim = (512, 512), (2048, 4), np.dtype(np.float32), 2
        data = type("ptr", (), {"ptr": 1 << 20})

        def __array__(self, *args, **kwargs):
            raise TypeError("Implicit conversion to a NumPy array is not allowed")

    assert "kernel  warptile_64x64" in fastmm.explain(DeviceOnly(), DeviceOnly())   # 512^3
    assert "float64 product: CuPy" in fastmm.explain(DeviceOnly(), [[1.0]] * 512)  # a host list of floats


@pytest.mark.parametrize("size,cls", [(1, 1), (3, 3), (5, 6), (700, 768), (768, 768), (769, 1024), (1000, 1024),
                                      (4096, 4096), (4097, 6144), (6145, 8192)])
def test_tune_size_classes(size, cls):
    assert _plan.tuned._size_class(size) == cls


@pytest.mark.parametrize("m,n,k,aligned,ahead", [
    (768, 768, 256, True, "partial wave"),          # 72 tiles of 128x64, K too short to split
    (8192, 1, 8192, False, None),                   # matrix-vector: 1.21-1.23x
    (4096, 16, 4096, True, None),                   # few columns: 1.01-1.03x
    (8, 4096, 4096, True, None),                    # few rows: 1.15-1.16x
    (2048, 1, 16384, True, None),                   # K over clusters of two: 0.98x
    (4096, 24, 8192, True, "narrow output"),               # 17-31 columns: split-K on 64x64 tiles
    (256, 256, 65536, True, None),                  # 128x256 tiles on the 16-deep loop: 0.99x
    (128, 128, 65536, True, None),                  # 128x64 tiles: 1.04x
    (3001, 3001, 3001, False, None),                # on aligned copies, K padded, summed in runs: 0.91-0.93x
    (2501, 2501, 2501, False, "unaligned"),         # below the aligned copies' 2^34: 0.81x
    (4097, 4097, 4097, False, None),                # on aligned copies, its ragged edge peeled off: 1.08x
    (4096, 4096, 4096, True, None),                 # level with cuBLAS or ahead: fastmm's
    (1024, 1024, 1024, True, None),
    (256, 256, 256, True, None),
    (64, 1, 64, False, None),                       # narrow but small: the cheaper call wins
    (63, 63, 63, False, None),                      # unaligned but far from a wave
    (65536, 128, 128, True, None),
    (10000, 10000, 3, False, None),                 # outer products writing C in 16-byte stores: 1.09-3.39x
    (7021, 3497, 3, False, "unaligned"),            # ... C's rows unaligned (N odd): 0.91x
])
def test_cublas_ahead_names_the_measured_classes(m, n, k, aligned, ahead):
    problem = _plan.Problem(m, n, k, aligned=aligned)
    why = _plan.cublas_ahead(problem, _plan.choose(problem), _plan.Device())
    assert (why if why is None else why.split(":")[0]) == ahead
    forced = _plan.choose(problem, kernel="warptile")
    assert _plan.cublas_ahead(problem, forced, _plan.Device()) is None  # a forced kernel is never second-guessed


def test_cublas_ahead_leaves_a_small_batch_split_item_by_item_to_fastmm():
    """split-k-idle's single products run behind cuBLAS (the hook leaves them to it); a small batch split item by item
    runs 1.2-2.6x cuBLAS, so the hook keeps it."""
    single, batch = _plan.Problem(804, 33, 7189), _plan.Problem(95, 150, 10191, 2)
    assert _plan.choose(single).rule == _plan.choose(batch).rule == "split-k-idle"
    assert _plan.cublas_ahead(single, _plan.choose(single), _plan.Device()).startswith("few tiles on a long K")
    assert _plan.cublas_ahead(batch, _plan.choose(batch), _plan.Device()) is None


def test_explain_says_when_the_cupy_hook_leaves_a_product_to_cublas():
    assert "under accelerate_cupy(), plain CuPy arrays leave this product to cuBLAS (partial wave" in \
        fastmm.explain((768, 256), (256, 768))
    assert "accelerate_cupy" not in fastmm.explain((4096, 4096), (4096, 4096))


def test_explain_says_when_a_part_of_a_product_leaves_it_to_cublas():
    """1025x1025x9000 peels its last row and column; its 1024x1024 interior, planned as a product of its own, is a class
    cuBLAS is measured ahead of (split-k-idle's single products), and the runtime checks every part it plans: under
    the hook the whole product goes to cuBLAS, and explain says why."""
    problem = _plan.Problem(1025, 1025, 9000, b_aligned=False)
    c = _plan.choose(problem)
    assert c.peel == (1, 1) and _plan.cublas_ahead(problem, c, _plan.Device()) is None
    text = fastmm.explain((1025, 9000), (9000, 1025))
    assert "leave this product to cuBLAS (its interior: few tiles on a long K" in text


def test_precision_modes_follow_pytorchs_names():
    assert fastmm.get_float32_matmul_precision() == "highest"
    fastmm.set_float32_matmul_precision("high")
    try:
        assert fastmm.get_float32_matmul_precision() == "high"
        with fastmm.matmul_precision("medium"):
            assert fastmm.get_float32_matmul_precision() == "medium"
        assert fastmm.get_float32_matmul_precision() == "high"
    finally:
        fastmm.set_float32_matmul_precision("highest")
    for bad in ("tf32", "HIGH", None):
        with pytest.raises(ValueError, match="valid values: 'highest', 'high', 'medium'"):
            fastmm.set_float32_matmul_precision(bad)
    with pytest.raises(ValueError, match="unknown float32 matmul precision 'fast'"):
        with fastmm.matmul_precision("fast"):
            pass
    assert fastmm.get_float32_matmul_precision() == "highest"


def test_precision_blocks_nest_reenter_and_decorate():
    """matmul_precision is a block that nests, may be entered again inside itself, and decorates a function with a
    block of its own per call (threads included), as a contextlib context manager does."""
    import threading

    block = fastmm.matmul_precision("high")
    with block:
        with fastmm.matmul_precision("medium"):
            assert fastmm.get_float32_matmul_precision() == "medium"
        with block:
            assert fastmm.get_float32_matmul_precision() == "high"
        assert fastmm.get_float32_matmul_precision() == "high"
    assert fastmm.get_float32_matmul_precision() == "highest"

    seen = []

    @fastmm.matmul_precision("medium")
    def deep(n):
        seen.append(fastmm.get_float32_matmul_precision())
        return deep(n - 1) if n else None

    threads = [threading.Thread(target=deep, args=(20,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == ["medium"] * 8 * 21
    assert fastmm.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("m,n,k,high,medium", [
    (4096, 4096, 4096, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),  # large single products: wgmma
    (2048, 1024, 2048, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),
    (768, 768, 768, None, "tf32wg_128x256x32_s4_maprb"),  # 2^28.75: one pass on wgmma; 3xTF32 slower than FP32 here
    (1000, 1000, 1000, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),  # 8 x 8 tiles: 3xTF32 on wgmma pays
    (4096, 900, 4096, None, "tf32wg_128x256x32_s4_maprb"),  # ... not on an output side below 960
    (256, 256, 256, None, "tf32_64x64x16_32x32_s4"),  # small: mma.sync for one pass
    (65536, 128, 128, None, "tf32_64x64x16_32x32_s4"),  # 2^30, but the split passes would dominate a thin output
    (16384, 16384, 64, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),  # a short K: wide both ways
    # Rows of A, or of B^T, past what one launch of the split pass covers (65535 blocks of 32 rows, in whole block
    # tiles): the FP32 table and the mma.sync tiles, which need no split operands.
    (2097024, 1024, 1024, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),
    (2097024 + 1, 1024, 1024, None, "tf32_128x256x16_64x64_s3"),
    (1024, 2096896, 1024, "tf32x3wg_128x128x32_s3", "tf32wg_128x256x32_s4_maprb"),
    (1024, 2096896 + 1, 1024, "tf32x3wg_128x128x32_s3", "tf32_128x256x16_64x64_s3"),  # B^T in 256-row tiles
    (1024, 2097024 + 1, 1024, None, "tf32_128x256x16_64x64_s3"),
])
def test_tensor_core_modes_pick_tensor_tiles(m, n, k, high, medium):
    p = _plan.Problem(m, n, k)
    fp32 = _plan.choose(p)
    assert fp32.config.precision == "highest"
    expected_high = high or fp32.name  # below 3xTF32's threshold on Hopper: the FP32 table, as accurate and faster
    assert _plan.choose(p, precision="high").name == expected_high
    assert _plan.choose(p, precision="medium").name == medium
    with fastmm.matmul_precision("high"):
        assert _plan.choose(p).name == expected_high  # the memo keeps modes apart
    assert _plan.choose(p).config.precision == "highest"
    if high is None:
        assert "in 'high' precision: FP32 FMAs" in _plan.choose(p, precision="high").reason


@pytest.mark.parametrize("a_t,b_t,aligned,maps", [(False, False, True, "_maprb"), (False, True, True, "_mapab"),
                                                  (True, True, True, "_maprb"), (True, False, True, "_mapr"),
                                                  (False, True, False, "")])
def test_medium_reads_k_major_aligned_operands_through_tensor_maps(a_t, b_t, aligned, maps):
    """One TF32 pass on wgmma: A of A @ B (K-major, or along M into registers), and B given as B^T, go through
    TFLOAT32 tensor maps where their rows are 16-byte aligned; A @ B with B along N runs as C^T = B^T A^T, both
    mapped; the others are split (the runtime checks the operands themselves as well)."""
    p = _plan.Problem(4096, 4096, 4096, a_t=a_t, b_t=b_t, aligned=aligned, a_aligned=aligned, b_aligned=aligned)
    choice = _plan.choose(p, precision="medium")
    assert choice.name == "tf32wg_128x256x32_s4" + maps
    assert ("tensor map" in choice.reason) == bool(maps)
    assert "tensor map" not in _plan.choose(p, precision="high").reason


A100 = _plan.Device(name="A100", compute_capability=(8, 0), sm_count=108, max_smem_optin=163 * 1024)
ADA = _plan.Device(name="L4", compute_capability=(8, 9), sm_count=58, max_smem_optin=99 * 1024)


@pytest.mark.parametrize("device", [A100, ADA], ids=lambda d: d.name)
def test_every_choice_fits_the_gpus_shared_memory(device):
    """The table is measured on Hopper (227 KiB of shared memory per block); a GPU with less runs the same tile with
    16-deep stages, and 5 to 16 columns on the tiles where the few-column block (104 KiB) does not fit."""
    from fastmm._tools.bench import SHAPES

    problems = [_plan.Problem(s.m, s.n, s.k, batch=s.batch, a_t=s.a_t) for s in SHAPES]
    problems += [_plan.Problem(m, n, k, a_t=a_t, b_t=b_t) for m, n, k in
                 [(4096, 4096, 4096), (8192, 8192, 8184), (4097, 4097, 4097), (256, 256, 65536), (4096, 12, 4096),
                  (12, 4096, 4096), (3001, 3001, 3001), (16384, 16384, 64)]
                 for a_t, b_t in [(False, False), (True, False), (False, True), (True, True)]]
    for p in problems:
        for precision in ("highest", "high", "medium"):
            choice = _plan.choose(p, device, precision=precision)  # validated: raises if the device cannot run it
            assert choice.config.smem_bytes <= device.max_smem_optin, (p, precision, choice.name)
    square = _plan.choose(_plan.Problem(4096, 4096, 4096), device)
    assert square.name == _plan.tiles.WT256_LOOP16 and "fewer than warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512" in square.reason
    assert _plan.choose(_plan.Problem(4096, 4096, 4096)).name == _plan.tiles.WT256_SLICES  # Hopper: the measured table
    long_k = _plan.choose(_plan.Problem(4096, 4096, 4096, a_t=True), device)
    assert long_k.name == _plan.tiles.WT256_LOOP16  # one running sum: the slots of the partial sums need 226 KiB
    few = _plan.choose(_plan.Problem(4096, 12, 4096), device)
    assert (few.rule == "few-columns") == (device is A100), few.name


@pytest.mark.parametrize("device", [A100, ADA], ids=lambda d: d.name)
def test_forced_families_and_fallbacks_fit_the_gpu_too(device):
    """A forced family is the table restricted to it, lighter configurations included; the plan without aligned
    copies (what runs when they do not fit in memory) likewise; the cluster kernels need Hopper or newer."""
    for p in (_plan.Problem(8192, 8192, 8192), _plan.Problem(8192, 8192, 8192, b_t=True),
              _plan.Problem(8191, 8191, 8191, aligned=False, a_aligned=False, b_aligned=False)):
        for family in ("warptile", "tf32x3", "tf32", "regtile", "smem"):
            assert _plan.choose(p, device, family).config.smem_bytes <= device.max_smem_optin, (p, family)
        assert _plan.without_copies(p, device).config.smem_bytes <= device.max_smem_optin
        assert _plan.invalid(_plan.without_copies(p, device).config, device) is None
    assert _plan.choose(_plan.Problem(8192, 8192, 8192), kernel="warptile").name == _plan.tiles.WT256_SLICES  # Hopper
    with pytest.raises(ValueError, match=r"fewcol_n1_c2: needs compute capability 9.0 or newer; this device is 8"):
        _plan.choose(_plan.Problem(4096, 1, 65536), device, "fewcol_n1_c2")
    assert "needs compute capability 9.0 or newer" in _plan.invalid(configs.get_config("fewcol_n16_c8"), device)
    assert _plan.invalid(configs.get_config("fewcol_n16_c8"), _plan.Device()) is None


def test_compile_command_builds_what_the_architecture_runs():
    from fastmm.__main__ import _all_binaries, _runs_on

    wgmma, cluster, tile = (configs.get_config(n) for n in ("tf32wg_128x256x32_s4", "fewcol_n1_c2", _plan.tiles.WT64))
    assert [_runs_on(c, "sm_90") for c in (wgmma, cluster, tile)] == [True, True, True]
    assert [_runs_on(c, "sm_80") for c in (wgmma, cluster, tile)] == [False, False, True]
    assert [_runs_on(c, "sm_89") for c in (wgmma, cluster, tile)] == [False, False, True]
    assert [_runs_on(c, "sm_100a") for c in (wgmma, cluster, tile)] == [False, True, True]
    assert all(_runs_on(c, "sm_90") for c, _ in _all_binaries())


def test_wgmma_kernels_run_on_hopper_single_products_only():
    ampere = _plan.Device(name="A100", compute_capability=(8, 0), sm_count=108)
    big, batched = _plan.Problem(4096, 4096, 4096), _plan.Problem(1024, 1024, 1024, batch=8)
    # Elsewhere than Hopper, and for batches, the mma.sync tiles.
    assert _plan.choose(big, ampere, precision="high").name == "tf32x3_128x128x32_64x32_s3"
    assert _plan.choose(big, ampere, precision="medium").name == "tf32_128x256x16_64x64_s3"
    assert _plan.choose(batched, precision="medium").config.family == "tf32"
    with pytest.raises(ValueError, match=r"runs on compute capability 9.0 \(sm_90a\) only; this device is 8.0"):
        _plan.choose(big, ampere, kernel="tf32x3wg_128x128x32_s3")
    # The split pass launches read A and B^T through their strides: one binary for every layout.
    for p in (big, _plan.Problem(4096, 4096, 4096, a_t=True, b_t=True, aligned=False)):
        choice = _plan.choose(p, precision="high")
        assert choice.rule == "tensor-wgmma" and choice.config.binary_name(choice.variant) == choice.name
    assert {"tf32x3wg", "tf32wg", "tf32x3wg_128x128x32_s3"} <= set(fastmm.kernel_names())


def test_modes_keep_the_fp32_paths_where_the_table_splits_k_or_has_nothing_to_do():
    long_k = _plan.Problem(128, 128, 65536)
    choice = _plan.choose(long_k, precision="high")
    assert choice.rule == "split-k" and choice.splits > 1 and "'high' uses FP32 FMAs here" in choice.reason
    assert _plan.choose(_plan.Problem(0, 8, 8), precision="medium").rule == "empty"
    # A forced kernel wins over the mode, and a tensor family can be forced in any mode.
    assert _plan.choose(_plan.Problem(512, 512, 512), kernel="warptile", precision="high").config.precision == "highest"
    assert _plan.choose(_plan.Problem(512, 512, 512), kernel="tf32x3").config.precision == "high"
    assert {"tf32x3", "tf32", "tf32x3_128x128x32_64x32_s3"} <= set(fastmm.kernel_names())


def test_explain_names_the_mode():
    text = fastmm.explain((4096, 4096), (4096, 4096), precision="high")
    assert "kernel  tf32x3wg_128x128x32_s3" in text and "mode    high: 3xTF32" in text
    assert "rule    tensor-wgmma: precision 'high'" in text and "accelerate_cupy" not in text
    assert "mode    highest: FP32 FMAs" in fastmm.explain((4096, 4096), (4096, 4096))
    with pytest.raises(ValueError, match="valid values"):
        fastmm.explain((8, 8), (8, 8), precision="low")


@pytest.mark.parametrize("m,n,k,name,splits", [
    (8192, 1, 8192, "fewcol_n1", 1),        # 256 blocks of 32 rows: 0.97 of a wave of 264 as they are
    (4096, 16, 4096, "fewcol_n16_c2", 1),   # 128 blocks: a cluster of two fills one wave (two blocks per SM)
    (4096, 3, 4096, "fewcol_n4", 1),        # up to 4 columns, one block per SM: 256 would be two
    (6400, 1, 640, "fewcol_n1", 1),         # never slices thinner than 512
    (1, 8192, 8192, "fewcol_n1", 1),        # few rows: the same kernel on the transposed product
    (16, 16, 1 << 20, "fewcol_n16", 264),   # one block of rows: K cut for two blocks per SM
    (100, 4, 8192, "fewcol_n4_c16", 1),     # 4 blocks of rows, each over a cluster of 16 (8 would leave 100 SMs idle)
    (2048, 1, 16384, "fewcol_n1_c2", 1),    # 64 blocks: clusters of two, one block per SM
    (9600, 4, 4096, "fewcol_n4", 1),        # 300 blocks: more than the SMs hold at once, so no slices
])
def test_few_columns_and_rows_read_the_large_operand_once(m, n, k, name, splits):
    c = choose(m, n, k)
    assert (c.rule, c.name, c.splits) == ("few-columns", name, splits)
    assert c.config.precision == "highest" and _plan.choose(_plan.Problem(m, n, k), precision="high").name == name


@pytest.mark.parametrize("m,n,k,layout,name", [
    (2898, 2, 1232, {"a_t": True}, "fewcol_n4_c2"),              # 91 blocks of rows, A m-contiguous: 2.11x -> 3.13x
    (1, 2358, 3046, {}, "fewcol_n1_c3"),                         # few rows: A is B^T, m-contiguous; 74 blocks
    (1491, 4, 2846, {"a_t": True, "b_t": True}, "fewcol_n4_c5"),  # 47 blocks: 235 of 264 slots
    (2550, 1, 4808, {"a_t": True}, "fewcol_n1_c3"),              # 80 blocks: 240
    (2856, 2, 1323, {"b_t": True}, "fewcol_n4"),                 # A row-major: one block an SM (2.16x, 2.02x in pairs)
    (791, 1, 13821, {"aligned": False}, "fewcol_n1_c4"),         # ... and clusters of 2, 4 or 8 (6.4x in 4, 4.5x in 5)
])
def test_few_columns_with_a_m_contiguous_fill_two_blocks_an_sm_in_a_cluster_of_any_size(m, n, k, layout, name):
    """A few-column kernel reading an m-contiguous A gains from a second block on its SM, so its cluster is the most
    blocks (2 to 8) that fill two an SM; reading a row-major A it keeps one an SM, in clusters of 2, 4 or 8."""
    p, c = _planned(m, n, k, **layout)
    assert (c.rule, c.name, c.splits) == ("few-columns", name, 1)
    assert p.blocks(c.config) <= c.config.min_blocks * H100.sm_count


@pytest.mark.parametrize("m,n,k,layout,name", [
    (142, 28, 15596, {"aligned": False}, "fewcol_n32_s3_c16"),  # 5 blocks of rows: 0.73x -> 1.20x cuBLAS
    (28, 47, 9339, {"a_t": True}, "fewcol_n32_s3_c16"),         # 2: 1.14x -> 1.77x
    (135, 1, 35769, {"a_t": True, "b_t": True}, "fewcol_n1_c16"),  # 5: 0.69x -> 1.20x
    (9, 200, 11826, {"aligned": False}, "fewcol_n16_c16"),       # 7: 2.16x -> 3.50x
    (278, 6, 12921, {"b_t": True}, "fewcol_n8_c8"),              # 9: 144 blocks past 132 SMs (1.77x against 1.98x)
    (324, 26, 14637, {"a_t": True, "b_t": True}, "fewcol_n32_s3_c8"),  # 11 (0.66x against 0.69x)
    (5, 43, 70673, {}, "fewcol_n8"),                             # too deep for one cluster: slices, as before
])
def test_few_blocks_of_rows_split_k_over_a_cluster_of_16(m, n, k, layout, name):
    """Where a cluster of 8 would run and 16 blocks a block of rows still fit one an SM, a cluster of 16 (Hopper's
    non-portable size); each block walks at least 512 of K, and a lane's runs stay within the few-column bound."""
    p, c = _planned(m, n, k, **layout)
    assert c.name == name and (c.splits == 1) == ("_c" in name)
    assert _plan.serial_run(c, p) <= 384
    hopper = not c.config.min_compute_capability or c.config.min_compute_capability <= (9, 0)
    assert hopper and p.blocks(c.config) <= (H100.sm_count if name.endswith("_c16") else 2 * H100.sm_count)


@pytest.mark.parametrize("m,n,k,batch,a_t,b_t,name", [
    (14, 10, 12973, 48, True, True, "fewcol_n16_c8"),  # Fortran order: one lane's run of K / 8 over 8 blocks
    (14, 10, 12973, 48, False, False, "fewcol_n16_c4"),  # one sum a lane: at most 160 terms
    (741, 2, 7835, 4, True, True, "fewcol_n4"),  # up to 4 columns sums restart every 8 steps: runs of 128
    (1000, 8, 3000, 10, False, False, "fewcol_n8"),  # runs within 384 terms: no cluster
])
def test_batched_few_columns_sum_a_long_k_over_a_cluster(m, n, k, batch, a_t, b_t, name):
    """A batch takes no slice-sum pass, so a lane's run past 384 terms is cut over a cluster per batch item."""
    c = choose(m, n, k, batch, a_t=a_t, b_t=b_t)
    assert (c.rule, c.name, c.splits) == ("few-columns", name, 1)


def test_few_column_variants_need_only_the_large_operand_aligned():
    # x @ v: v's stride along k is one element, so the product is "unaligned", but A's rows are not.
    matvec = _plan.choose(_plan.Problem(8192, 1, 8192, aligned=False, a_aligned=True, b_aligned=False))
    assert matvec.variant == Variant(False, False, 4)
    # v @ W (few rows): the kernel runs on W^T v^T; W^T has unit stride along m (copied 16 bytes, 4 rows, at a time
    # when its columns are 16-byte aligned), v^T along k.
    vecmat = _plan.choose(_plan.Problem(1, 8192, 8192, aligned=False, a_aligned=False, b_aligned=True))
    assert vecmat.variant == Variant(True, True, 4)
    unaligned = _plan.choose(_plan.Problem(1, 8192, 8192, aligned=False, a_aligned=True, b_aligned=False))
    assert unaligned.variant == Variant(True, True, 1)
    # explain names the binary the launch runs: the layout of the transposed product's own arguments.
    v, w = np.zeros(8192, np.float32), np.zeros((8192, 8192), np.float32)
    text = fastmm.explain(v, w)
    assert "kernel  fewcol_n1_tn_v4" in text and "grid    256 blocks of 256 threads" in text, text  # 8192 rows of W^T, no slices


def test_every_family_can_be_forced_on_any_shape():
    for family in ("naive", "smem", "regtile", "warptile", "tf32x3", "tf32", "fewcol"):
        for m, n, k in ((4096, 4096, 4096), (8192, 1, 8192), (1, 8192, 8192), (7, 9, 5)):
            c = _plan.choose(_plan.Problem(m, n, k), kernel=family)
            assert c.rule == "forced" and c.config.family == family, (family, m, n, k)


def test_out_of_memory_fallbacks_are_the_plans():
    """Where a choice's workspace does not fit, the plan (not the runtime) names what runs instead: no aligned copies,
    or the mma.sync tiles of the wgmma kernel's precision; a choice with no workspace has nothing to fall back from."""
    ragged = _plan.Problem(8191, 8191, 8191, aligned=False, a_aligned=False, b_aligned=False)
    padded = _plan.choose(ragged)
    assert padded.pad
    assert _plan.after_out_of_memory(ragged, _plan.Device(), padded) == _plan.without_copies(ragged, _plan.Device())
    square = _plan.Problem(6144, 6144, 6144)  # below Ozaki scheme II's threshold
    with _plan.matmul_precision("high"):
        wg = _plan.choose(square)
        assert isinstance(wg.config, configs.WgTile)
        fallback = _plan.after_out_of_memory(square, _plan.Device(), wg)
    assert fallback.config.family == "tf32x3" and fallback.config.smem_bytes <= _plan.Device().max_smem_optin
    with pytest.raises(ValueError, match="needs no workspace"):
        _plan.after_out_of_memory(square, _plan.Device(), _plan.choose(square))


@pytest.mark.parametrize("old, new", [("skinny", "fewcol"), ("skinny_n1", "fewcol_n1"), ("skinny_n4_c2", "fewcol_n4_c2")])
def test_former_kernel_names_still_work_with_a_warning(old, new):
    """The few-column family was called "skinny": a program or tuned cache that names it keeps working, warned."""
    problem = _plan.Problem(1, 8192, 8192)
    with pytest.warns(DeprecationWarning, match=f"'{old}' is now '{new}'"):
        choice = _plan.choose(problem, kernel=old)
    assert choice.name.startswith(new) and choice.config.family == "fewcol"
    with pytest.warns(DeprecationWarning):
        with _plan.use_kernel(old):
            assert _plan.forced_kernel() == new
    with pytest.raises(KeyError, match="unknown kernel 'skinny_n3'"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            _plan.choose(problem, kernel="skinny_n3")


@pytest.mark.parametrize("m,n,k,splits,depth", [
    (804, 33, 7189, 28, 256),   # 13 tiles of 64x64: 28 slices of 256 and a last launch 21 deep
    (48, 60, 2392, 16, 144),    # one tile: 16 slices at least 128 deep (balanced_splits)
    (64, 4096, 4096, 4, 1024),  # 64 rows: 64 tiles of 64x64 (128x64 ones would be half padding), two blocks an SM
    (4944, 97, 52685, 16, None),  # 156 tiles, K over 4x the output's sides: 19 blocks an SM (0.59x; 3 slices 0.53x)
])
def test_split_k_idle_fills_a_wave_of_64x64_slices(m, n, k, splits, depth):
    """Where even 64x64 tiles leave SMs without a block on a long K, K is cut to fill the block slots, evenly or not."""
    c = choose(m, n, k)
    assert (c.rule, c.name, c.splits) == ("split-k-idle", _plan.tiles.WT64, splits)
    if depth:
        assert k // splits // 16 * 16 == depth
    # Not where the tiles already fill the GPU, nor for a K short of two slices.
    assert choose(1024, 1024, 1024).rule == "tiled" and choose(1000, 1000, 3000).rule != "split-k-idle"
    assert choose(804, 32, 1000).rule != "split-k-idle"


@pytest.mark.parametrize("m,n,k,batch,splits", [
    (95, 150, 10191, 2, 39),   # 5 tiles of 128x32 an item: 39 slices of 261 (K // 256)
    (70, 27, 10604, 4, 41),
    (98, 258, 3100, 3, 12),    # 27 tiles: 19 slices would fill a wave, 12 keep them 256 deep
    (98, 258, 2038, 3, 7),     # 0.52x cuBLAS unsplit, 1.59x in 4 slices, 1.73x in 9 (H200)
    (20, 231, 2249, 4, 8),     # 0.65x unsplit, 1.95x in 4, 3.08x in 16
    (22, 374, 527, 8, 4),      # K under 1024: slices 128 deep (1.31x unsplit, 1.69x in 4)
])
def test_split_k_idle_splits_a_batch_whose_tiles_leave_sms_idle(m, n, k, batch, splits):
    """A batch whose tiles, all items together, leave SMs without a block, from K = 512: as many slices as fill one
    wave of block slots with every item's slices (one launch), each 256 deep at least (128 below K = 1024)."""
    c = choose(m, n, k, batch)
    assert (c.rule, c.splits) == ("split-k-idle", splits)
    # Not a K under 512, nor a batch whose tiles give every SM a block.
    assert choose(m, n, 511, batch).splits == 1
    assert choose(1000, 1000, 8192, 2).splits == 1 and choose(128, 128, 65536, 33).splits == 1


@pytest.mark.parametrize("m,n,k,layout,rule,splits", [
    (1988, 880, 3074, {"b_t": True}, "split-k-wave", 2),      # measured: 1.06x the 128x64 tile, 0.52x cuBLAS's error
    (636, 2151, 1624, {"aligned": False}, "split-k-wave", 3),  # 0.81x cuBLAS (2 slices: 0.73x)
    (739, 3367, 1559, {"a_t": True, "b_t": True}, "tiled", 1),  # 1.01x, 0.28x
])
def test_a_long_ragged_k_under_a_wave_is_summed_per_k_tile(m, n, k, layout, rule, splits):
    """Less than a wave of 128x64 blocks on a long K not a multiple of 16 summed K in one chain on the unrolled tile,
    up to 2.6x cuBLAS's error: 64x64 tiles with sums per K-tile instead, as fast where measured; batched products and
    narrow outputs keep the 128x64 tile (in runs of 512 past K = 4096), and so does a K short of 1536."""
    aligned = layout.get("aligned", True)
    p = _plan.Problem(m, n, k, **layout, a_aligned=aligned, b_aligned=aligned)
    c = _plan.choose(p)
    assert (c.rule, c.name, c.splits) == (rule, _plan.tiles.WT64, splits)
    assert _plan.serial_run(c, p) <= 256
    runs = "warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"
    assert _plan.choose(_plan.Problem(7017, 1690, 7204, batch=3, a_t=True)).name == runs
    # a wave and more: a ragged K from 1536 in runs (one chain had 2.0x cuBLAS's error), as in 2.5 waves
    assert _plan.choose(_plan.Problem(1108, 5814, 2522, aligned=False)).name == runs
    assert _plan.choose(_plan.Problem(2900, 2900, 1601, aligned=False)).name == _plan.tiles.WT128x64
    assert _plan.choose(_plan.Problem(9826, 123, 24645)).name == runs  # narrow: the runs, not one chain
    assert _plan.choose(_plan.Problem(1000, 1000, 1000)).name == _plan.tiles.WT128x64  # short ragged K: one chain


@pytest.mark.parametrize("m,n,k", [(4096, 4096, 4100), (2048, 2048, 1000), (3072, 3072, 8200), (1024, 1024, 1100)])
def test_a_ragged_k_runs_the_loop_whose_tail_follows_it(m, n, k):
    """K not a multiple of 16: the sub-tile loops' ragged twins, where whole K-tiles on whole tiles take the loops
    themselves (the kernel reads the last K % 16 terms after the loop); the same rules, the same runs."""
    ragged, whole = _plan.choose(_plan.Problem(m, n, k)), _plan.choose(_plan.Problem(m, n, k - k % 16))
    assert ragged.name == whole.name + "_ragged" and ragged.rule == whole.rule and ragged.config.ragged
    assert ragged.config.sub_k and not whole.config.ragged
    # Forced onto a ragged K, a loop that is not a twin leaves every block to the unrolled path: one chain over K.
    p = _plan.Problem(m, n, k)
    assert _plan.serial_run(_plan.choose(p, kernel=whole.name), p) == k


@pytest.mark.parametrize("m,n,k,b_t,name", [
    (3000, 3000, 8192, False, "warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"),  # 56 rows and columns past tiles
    (3000, 3000, 8192, True, "warptile_128x64x16_32x64_8x8_s3_sub8_f512_ragged"),
    (6000, 5000, 7008, False, "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512_ragged"),
    (6000, 5000, 7008, True, "warptile_128x256x16_64x64_8x16_s4_spread_sub16_f512"),  # B^T: edges keep one chain
])
def test_blocks_across_the_edges_sum_in_runs_where_the_loop_takes_them(m, n, k, b_t, name):
    """A loop in runs of 512 on a product with blocks across C's edges: its ragged twin, whose loop takes those blocks
    too (they summed all of K in one chain on the unrolled path), except the 128x256 tile copying B^T transposing,
    where the edges' masks spilled registers: explain then counts the edges' one chain."""
    p = _plan.Problem(m, n, k, b_t=b_t)
    c = _plan.choose(p)
    if c.peel != (0, 0):
        p = _plan.interior(p, c.peel)
        c = _plan.choose(p)
    assert c.name == name
    assert _plan.serial_run(c, p) == (k if name.endswith("f512") else 512)


def test_long_k_on_large_tiles_fills_the_slots_when_k_has_no_even_cut():
    """1000x1000x100000: 32 tiles of 128x256; the only even cut (2) would leave half the SMs idle, so 4 slices, in
    runs of 512 (on the ragged twin: its blocks across C's edges too), the last 32 of K as a launch of their own."""
    c = choose(1000, 1000, 100000)
    assert (c.rule, c.name, c.splits) == ("split-k", _plan.tiles.WT256_SLICES_RAGGED, 4)


@pytest.mark.parametrize("m,n,k,aligned", [(36903, 4505, 4, False), (4157, 4856, 7, False), (4096, 4096, 8, True),
                                           (5885, 4766, 15, False), (5631, 2923, 105, False)])
def test_short_k_runs_on_64x64_tiles(m, n, k, aligned):
    """K of 16 or less, or below 128 on unaligned rows: bound by writing C, where 64x64 tiles beat the large ones; up
    to 16, on the twin that writes C through shared memory where its rows take no 16-byte stores, 8 deep up to 8."""
    p = _plan.Problem(m, n, k, aligned=aligned, a_aligned=aligned, b_aligned=aligned)
    c = _plan.choose(p)
    short = _plan.tiles.WT64_SHORT8 if k <= 8 else _plan.tiles.WT64_SHORT
    assert (c.rule, c.name) == ("tiled", short if k <= 16 else _plan.tiles.WT64)
    assert choose(16384, 16384, 64).name != _plan.tiles.WT64  # aligned rows and K past 16: the large tile


def test_large_tiles_sum_long_k_in_runs():
    """From K = 1024 on whole 16-deep K-tiles, the 128x256 tile keeps partial sums over runs of 512."""
    for m, n, k in ((2048, 2048, 2048), (12288, 12288, 12288), (6016, 5120, 7008)):
        assert choose(m, n, k).name == _plan.tiles.WT256_SLICES, (m, n, k)
    assert choose(4096, 4096, 4097).name == _plan.tiles.WT256_SLICES_RAGGED  # K not whole tiles: the last term after
    p = _plan.Problem(4096, 4096, 4097)  # ... and the loop that is not its twin, forced there: one chain over K
    assert _plan.serial_run(_plan.choose(p, kernel=_plan.tiles.WT256_SLICES), p) == 4097


@pytest.mark.parametrize("k,run", [(1, 16), (31, 16), (73, 16), (127, 32), (128, 32), (200, 48), (256, 64), (16368, 64)])
def test_tile_sums_take_runs_of_at_most_a_quarter_of_the_k_tiles(k, run):
    """The four-warp tiles sum K in runs of up to 4 K-tiles, but at most a quarter of them: a short K keeps the sums per
    K-tile that held its error at cuBLAS's (K = 31-73 had 1.5x cuBLAS's error in one run)."""
    from fastmm._plan.runs import run_of, tile_sums_run

    config = configs.BY_NAME[_plan.tiles.WT64]
    assert tile_sums_run(config, k) == run
    assert run_of(config, k) == max(min(run, k), -(-k // run))


@pytest.mark.parametrize("m,n,k,run", [
    (1024, 1024, 1024, 1024),      # one running sum over K
    (4096, 4096, 4096, 512),       # the 128x256 tile: runs of 512
    (4096, 4096, 4100, 516),       # ... and a ragged K's last 4 terms, added after its loop into the last run
    (3072, 3072, 8200, 520),       # the 128x64 tile past K = 4096: runs of 512, and the last 8 terms after them
    (3000, 3000, 8200, 520),       # ... on blocks across C's edges too
    (1000, 1000, 100000, 512),     # split-K into 4 slices of runs of 512 (and their sum), edge blocks too
    (8192, 1, 8192, 32),           # matrix-vector: 4 terms per lane and step, restarted every 8 steps
    (8192, 4, 8192, 32),           # up to 4 columns too (BLOCKED)
    (8192, 16, 8192, 128),         # 16 columns: 4 terms per lane and step, over 32 steps of a cluster's 2 blocks
    (64, 64, 262144, 528),         # 528 slices of 64x64 tile sums (the last short of the others): their sum
    (804, 33, 7189, 64),           # split-k-idle: 28 slices of 257 on sums per run of 64 (4 K-tiles)
    (768, 768, 768, 32),           # split-k-mid: 6 slices of 128 on runs of 2 K-tiles (a quarter of a slice's 8)
])
def test_each_plan_states_its_longest_running_sum(m, n, k, run):
    """The plan's side of accuracy: the longest run of terms one FP32 accumulator adds (explain prints it)."""
    p = _plan.Problem(m, n, k)
    assert _plan.serial_run(_plan.choose(p), p) == run
    assert f"at most {run} terms in one FP32 running sum (K = {k})" in fastmm.explain((m, k), (k, n))


def _exceeds_for_a_known_reason(p, c):
    """Where the plans still sum more than SERIAL_RUN_BOUND terms in one accumulator (docs/kernels/heuristic.md,
    'Accuracy: the longest running sum'): split-K's slices on the 128x64 tile's 8-step loop (one chain a slice), sums
    per K-tile past K = 16 x the bound, the few-column kernel's per-lane sums (measured at or below cuBLAS's error),
    and blocks across C's edges that a loop leaves to the unrolled path (128x256 tiles copying B^T transposing)."""
    name = c.config.name
    if c.pad or c.peel != (0, 0):
        inner = _plan.aligned_copies(p) if c.pad else _plan.interior(p, c.peel)
        return _exceeds_for_a_known_reason(inner, _plan.choose(inner))
    edges = (isinstance(c.config, WarpTile) and c.config.sub_k and (p.m % c.config.bm or p.n % c.config.bn)
             and not c.config.loops_edges(c.variant))
    return (name.startswith("fewcol") or c.splits > 1 and name.startswith("warptile_128x64") or
            getattr(c.config, "tile_sums", 0) and p.k > c.config.tile_sums * c.config.bk * _plan.SERIAL_RUN_BOUND
            or bool(edges))


def test_plans_past_the_running_sum_bound_are_the_known_classes():
    import random

    rng = random.Random(7)
    for _ in range(20000):
        m, n, k = (int(2 ** rng.uniform(0, 15)) for _ in range(3))
        if rng.random() < 0.3:
            k = int(2 ** rng.uniform(12, 17.5))
        aligned = rng.random() < 0.5
        p = _plan.Problem(m, n, k, a_t=rng.random() < 0.3, b_t=rng.random() < 0.3, aligned=aligned,
                          a_aligned=aligned, b_aligned=aligned)
        c = _plan.choose(p)
        if _plan.serial_run(c, p) > _plan.SERIAL_RUN_BOUND:
            assert _exceeds_for_a_known_reason(p, c), (p, c.rule, c.name, _plan.serial_run(c, p))


# Issue 42's rules: shapes from the random sweep's measurements (H100; docs/kernels/heuristic.md, the break-even points)

def _planned(m, n, k, batch=1, a_t=False, b_t=False, aligned=True):
    p = _plan.Problem(m, n, k, batch, a_t=a_t, b_t=b_t, aligned=aligned, a_aligned=aligned, b_aligned=aligned)
    return p, _plan.choose(p)


@pytest.mark.parametrize("m,n,k,batch,b_t", [(85401, 14, 1, 1, False), (13, 10188, 1, 8, False),
                                             (11, 1733, 8, 35, True)])
def test_short_k_few_columns_run_on_64x64_tiles(m, n, k, batch, b_t):
    """Few columns or rows on K <= 16 are bound by writing C: 64x64 tiles, not the few-column kernel."""
    p, c = _planned(m, n, k, batch, b_t=b_t)
    assert (c.rule, c.name) == ("short-k", _plan.tiles.WT64)
    assert _planned(85401, 14, 17)[1].rule == "few-columns-tiles"  # 5-16 columns to K = 384: the narrow tiles
    assert _planned(85401, 4, 17)[1].rule == "few-columns"


@pytest.mark.parametrize("m,n,k,a_t,name", [(164, 4, 11662, True, "fewcol_n4_c8"), (254, 5, 10286, False, "fewcol_n16_c8"),
                                            (1, 120, 12437, False, "fewcol_n4_c8")])
def test_small_few_column_products_split_over_one_cluster(m, n, k, a_t, name):
    """Below 2^24 multiply-adds, a cluster in one launch rather than more slices and a slice sum (of 16 blocks: these
    have at most 8 blocks of rows)."""
    p, c = _planned(m, n, k, a_t=a_t)
    assert c.rule == "few-columns" and c.splits == 1 and c.name.endswith("_c16"), (c.name, c.splits)
    big = _planned(16, 16, 1 << 20)[1]
    assert big.splits > 8  # 2^28 multiply-adds: the slices and their sum


@pytest.mark.parametrize("m,n,k,layout,name", [
    (121, 16, 8751, {"b_t": True}, "fewcol_n16_c16"),      # 17 slices: 0.63x cuBLAS; a cluster of 8: 1.36x; of 16
    (278, 6, 12921, {"b_t": True}, "fewcol_n8_c8"),        # 25 slices: 0.88x; 2.18x (9 blocks of rows: 16 passes the SMs)
    (5, 103, 35551, {"b_t": True}, "fewcol_n8_c16"),       # 4,444 a block: 0.87x -> 1.01x; 2,222 in 16: 1.58x
    (235, 9, 13775, {"aligned": False}, "fewcol_n16_c16"),  # 26 slices: 0.73x; 1.36x
])
def test_few_rows_in_more_than_16_slices_take_one_cluster_where_its_blocks_walk_a_short_k(m, n, k, layout, name):
    """Where filling the SMs would take more than 16 slices (two launches), a cluster of 8 in one launch instead, each
    block at most 5,120 deep; deeper, the slices (73 x 8 x 99824 (A^T): 1.25x cuBLAS in 88 slices, 0.42x on a cluster)."""
    p, c = _planned(m, n, k, **layout)
    assert (c.rule, c.name, c.splits) == ("few-columns", name, 1)
    assert _plan.serial_run(c, p) <= 384  # (a lane's runs stay within the few-column bound)
    deep = _planned(m, n, 8 * 5120 + 16, **layout)[1]
    assert deep.splits > 8 and not deep.name.endswith("_c8")
    assert _planned(73, 8, 99824, a_t=True)[1].splits > 8 and _planned(5, 43, 70673)[1].splits > 8


@pytest.mark.parametrize("m,n,k", [(33, 9598, 2655), (462, 40, 704), (200, 47, 1000)])
def test_narrow_outputs_on_a_mid_k_run_on_the_few_column_kernel(m, n, k):
    """33 to 47 rows or columns: the 16-column kernel, its blocks covering them 16 at a time (17 to 32 take the
    32-column kernel or the narrow tiles, below)."""
    p, c = _planned(m, n, k)
    assert (c.rule, c.name, c.splits) == ("narrow-few-columns", "fewcol_n16", 1)
    assert _planned(719, 36, 267)[1].rule != "narrow-few-columns"  # K short: the tiles won
    assert _planned(804, 33, 7189)[1].rule == "split-k-idle"  # a handful of tiles on a long K: split-k-idle first


@pytest.mark.parametrize("m,n,k,name", [
    (2925, 18, 477, "fewcol_n32_s3"),       # K under two slices of 256
    (3000, 20, 700, "fewcol_n32_s3_c2"),    # 94 blocks of 2: 350 of K each
    (4096, 32, 1536, "fewcol_n32_s3_c2"),   # 768 a block
    (804, 32, 7189, "fewcol_n32_s3_c8"),    # 26 blocks of 8: 899 a block, at most 1024 rows
    (324, 26, 14637, "fewcol_n32_s3_c8"),   # 1830 a block
    (380, 22, 820, "fewcol_n32_s3_c2"),     # slices of 410
])
def test_17_to_32_columns_run_on_the_32_column_kernel(m, n, k, name):
    """17 to 32 columns against more rows (or rows against more columns, computed transposed), K from 448: the
    32-column kernel, K split over a cluster where its blocks fit one wave, slices at least 256 deep, where a block
    walks at most 768 of K (2048 against at most 1024 rows): a lane's run of at most 256 terms."""
    for p, c in (_planned(m, n, k), _planned(n, m, k)):
        assert (c.rule, c.name, c.splits) == ("wide-few-columns", name, 1)
        assert _plan.serial_run(c, p) <= 256
    assert _planned(m, n, k, batch=2)[1].rule != "wide-few-columns"  # single products only
    assert _planned(2925, 18, 400)[1].rule != "wide-few-columns"  # K short


@pytest.mark.parametrize("m,n,k,name,splits", [
    (9787, 30, 1523, "warptile_128x32x16_32x32_8x4_s4_tsum4", 5),   # 306 blocks of 32 rows: 1523 of K each
    (7479, 17, 2706, "warptile_128x32x16_32x32_8x4_s4_tsum4", 4),   # 0.95x cuBLAS (9 slices: 0.84x)
    (1848, 19, 7157, "warptile_128x32x16_32x32_8x4_s4_tsum4", 16),  # 15 tiles: 0.97x (27 slices: 0.79x)
    (18, 3622, 9839, "warptile_32x128x16_32x32_8x4_s4_tsum4", 8),   # 0.88x (19 slices: 0.78x)
    (30, 9000, 900, "warptile_32x128x16_32x32_8x4_s4_tsum4", 1),    # K under 1024: one launch
    (100000, 20, 100000, "warptile_128x32x16_32x32_8x4_s4_tsum4", 16),
])
def test_17_to_32_rows_or_columns_past_the_32_column_kernel_run_on_narrow_tiles(m, n, k, name, splits):
    """Where a block of the 32-column kernel would walk more of K, the narrow tiles (32 rows or columns against 128),
    K split as split-K's on small tiles from K = 1024, in the count that balances the SMs' blocks."""
    p, c = _planned(m, n, k)
    assert (c.rule, c.name, c.splits) == ("narrow-tiles", name, splits)
    mirror = _planned(n, m, k)[1]
    assert (mirror.rule, mirror.config.tile, mirror.splits) == ("narrow-tiles", c.config.tile[::-1], splits)


@pytest.mark.parametrize("m,n,k,splits,tile", [(3144, 161, 10725, 6, (64, 64)), (112, 5606, 8639, 3, (64, 64)),
                                               (3026, 175, 2675, 8, (64, 64)), (8659, 71, 1820, 3, (128, 32)),
                                               (1031, 704, 1078, 2, (64, 64)), (71, 15653, 4148, 6, (32, 128))])
def test_split_k_wave_cuts_k_for_four_warp_tiles_short_of_a_wave(m, n, k, splits, tile):
    """64x64 tiles, or 128x32 (32x128) ones where an output side of 71 pads to 96 instead of 128; as many slices as
    balance the SMs' blocks (measured: 3144x161x10725 0.85x cuBLAS against 0.76x at 4 slices, 112x5606x8639 0.75x
    against 0.67x, 8659x71x1820 0.98x against 0.83x at 2)."""
    p, c = _planned(m, n, k, aligned=False)
    assert (c.rule, c.config.tile, c.splits) == ("split-k-wave", tile, splits)
    assert c.config.tile_sums  # one design: sums per run of K-tiles on every four-warp tile
    assert _planned(1024, 1024, 1024)[1].rule == "tiled"  # the tiled rule's 128x64 tiles: not split


@pytest.mark.parametrize("m,n,k,batch,tile", [
    (8659, 71, 1820, 1, (128, 32)),   # 71 columns: 96 on 32-wide tiles, 128 on 64-wide ones (75% of the area)
    (71, 8659, 1820, 1, (32, 128)),   # the mirror
    (8659, 71, 1000, 1, (64, 64)),    # a single product below K = 1024: the 64x64 tile (128x32 lost 5-20% there)
    (29, 5556, 700, 5, (32, 128)),    # ... but a batch takes the narrow tile at any K
    (8690, 100, 1820, 1, (64, 64)),   # 100 columns pad to 128 on either tile: no gain, the 64x64 tile
    (274, 5403, 2000, 1, (64, 64)),   # 288 x 5504 against 320 x 5440: 91% of the area, above the 90% threshold
])
def test_small_tile_takes_a_narrow_four_warp_tile_where_it_pads_far_less(m, n, k, batch, tile):
    problem = _plan.Problem(m, n, k, batch=batch)
    assert configs.get_config(_plan.tiles.small_tile(problem)).tile == tile


@pytest.mark.parametrize("m,n,k,aligned_tile", [
    (751, 3551, 271, (128, 64)),  # 84 tiles of 128x256: under three quarters of a wave, aligned or not
    (1755, 9240, 209, (128, 256)),
])
def test_unaligned_products_on_a_short_k_take_128x64_tiles(m, n, k, aligned_tile):
    p, c = _planned(m, n, k, aligned=False)
    assert c.rule == "tiled" and c.config.tile == (128, 64), c.name
    assert _planned(m, n, k)[1].config.tile == aligned_tile  # aligned rows: the large tile where it fills the SMs


@pytest.mark.parametrize("m,n,k,batch,a_t,b_t", [
    (1371, 3008, 62, 1, False, False),   # 132 tiles of 128x256: exactly one wave (1.04 -> 1.14x cuBLAS on 128x64)
    (10137, 249, 57, 1, False, False),   # 80 tiles (measured with B^T: 0.54 -> 0.95x)
    (1010, 3735, 49, 1, True, True),     # Fortran order, 120 tiles
    (1753, 1754, 41, 1, True, False),    # A^T, 98 tiles
    (1393, 759, 19, 2, False, False),    # a batch of 2, 66 tiles (measured with B^T: 1.31 -> 2.12x)
    (8776, 245, 80, 1, False, False),    # K a multiple of 16: under a wave of 128x64 blocks, its 8-step loop
])
def test_short_k_takes_the_large_tile_only_past_one_wave(m, n, k, batch, a_t, b_t):
    """Below K = 256 the 128x256 tile's reuse does not pay for SMs left without a block: up to one wave of its blocks
    the product takes the 128x64 tile (as any product the large tile does not fill); from K = 256, or past one wave,
    the large tile as before."""
    c = choose(m, n, k, batch, a_t=a_t, b_t=b_t)
    assert (c.rule, c.config.tile) == ("tiled", (128, 64)), c.name
    assert choose(1371, 3008, 256).config.tile == (128, 256)
    assert choose(2 * 1371, 3008, 62).config.tile == (128, 256)  # two waves


@pytest.mark.parametrize("m,n,k,a_t,b_t", [
    (1536, 1776, 560, False, False),  # 84 tiles of 128x256 (0.77 -> 0.95x cuBLAS on 128x64)
    (1120, 2032, 656, True, True),    # Fortran order, 72 tiles (0.64 -> 0.87x)
    (1520, 1792, 784, True, False),   # A^T, 84 tiles (0.77 -> 1.00x)
    (2016, 1504, 304, True, True),    # 96 tiles (0.87 -> 1.19x)
    (1495, 1503, 316, False, False),  # a ragged K: the unrolled 128x64 tile
])
def test_under_three_quarters_of_a_wave_the_large_tile_gives_way_below_k_1024(m, n, k, a_t, b_t):
    """Aligned products of K 256-1023 whose 128x256 blocks would leave a quarter of the SMs idle take 128x64 tiles;
    from three quarters of a wave, or from K = 1024 (the loops' runs), the large tile as before."""
    c = choose(m, n, k, a_t=a_t, b_t=b_t)
    assert (c.rule, c.config.tile) == ("tiled", (128, 64)), c.name
    assert choose(1408, 2288, 304, a_t=True, b_t=True).config.tile == (128, 256)  # 99 tiles: three quarters of 132
    assert choose(1536, 1776, 1031).config.tile == (128, 256)  # the loop in runs of 512


@pytest.mark.parametrize("m,n,k,batch", [
    (10688, 6404, 46, 1),   # 16.5 waves of 128x256 (0.78 -> 1.19x cuBLAS on 128x64)
    (11666, 16238, 78, 1),  # 44.6 waves (0.49 -> 0.88x)
    (10833, 4073, 97, 1),   # (0.52 -> 0.92x)
    (1865, 6061, 105, 4),   # a batch (0.55 -> 0.91x)
])
def test_short_k_a_times_b_transposed_takes_128x64_tiles(m, n, k, batch):
    """A . B^T below K = 256, both operands copied 4 bytes at a time: 128x64 tiles at any count of 128x256 ones; from
    K = 256, or with A transposed too (Fortran order: measured either way), the large tile as before."""
    c = choose(m, n, k, batch, b_t=True)
    assert (c.rule, c.config.tile) == ("tiled", (128, 64)), c.name
    assert choose(m, n, 256, batch, b_t=True).config.tile == (128, 256)
    assert choose(m, n, k, batch, a_t=True, b_t=True).config.tile == (128, 256)


def test_short_k_transposed_b_runs_on_aligned_copies():
    """36903x4505x4 with B^T (rows of 4 floats, unaligned): copied into 16-float rows. (K <= 3 is outer-products'.)"""
    p, c = _planned(36903, 4505, 4, b_t=True, aligned=False)
    assert c.rule == "aligned-copy" and c.pad
    assert not _planned(36903, 4505, 4, aligned=False)[1].pad  # B not transposed: its rows are long
    assert _planned(10099, 54648, 2, b_t=True, aligned=False)[1].rule == "outer-products"


@pytest.mark.parametrize("m,n,k,batch,a_t,b_t,aligned", [
    (7021, 3497, 3, 1, False, False, True), (2862, 5390, 2, 1, False, False, True),
    (10099, 54648, 2, 1, False, True, False), (13931, 11299, 1, 1, False, False, False),
    (1445, 1958, 1, 7, False, True, True), (5484, 2865, 2, 10, False, False, True)])
def test_outer_products_run_a_thread_per_piece_of_c(m, n, k, batch, a_t, b_t, aligned):
    """K <= 3 on >= 2^23 elements of C (the batch's), A not m-contiguous: the short-K kernel, one running sum of K
    terms, in every precision (bound by writing C)."""
    p, c = _planned(m, n, k, batch, a_t=a_t, b_t=b_t, aligned=aligned)
    assert (c.rule, c.name, c.splits, c.pad) == ("outer-products", "naive_32x8_4x4", 1, False)
    assert _plan.serial_run(c, p) == k
    for precision in ("high", "medium"):
        assert _plan.choose(p, precision=precision).name == "naive_32x8_4x4"
    assert configs.NAIVE_SHORT.tile == (32, 128)


@pytest.mark.parametrize("m,n,k,batch,b_t,tile", [
    (21931, 7, 373, 1, False, (128, 32)), (15579, 5, 475 - 91, 1, True, (128, 32)), (3507, 6, 23, 6, False, (128, 32)),
    (14, 30788, 227, 6, False, (32, 128)), (16, 9800, 384, 1, False, (32, 128))])
def test_few_columns_on_a_short_k_take_the_narrow_tiles(m, n, k, batch, b_t, tile):
    """5-16 columns (rows) on K <= 384: the 16-column kernel's blocks would walk three 128-deep steps or fewer; the
    128x32 (32x128) tile, unsplit, with sums per K-tile, in every precision."""
    p, c = _planned(m, n, k, batch, b_t=b_t)
    assert (c.rule, c.config.tile, c.splits) == ("few-columns-tiles", tile, 1)
    assert c.config.tile_sums and _plan.serial_run(c, p) <= 64  # (sums per run of at most 4 K-tiles)
    assert _plan.choose(p, precision="high").rule == "few-columns-tiles"


@pytest.mark.parametrize("m,n,k,rule", [
    (21931, 7, 385, "few-columns"),   # four steps: the few-column kernel
    (21931, 4, 373, "few-columns"),   # up to 4 columns: the narrower few-column kernels
    (21931, 16, 16, "short-k"),       # K <= 16: short-k's 64x64 tiles first
    (21931, 17, 373, "tiled"),        # 17 columns: not a few-column product
])
def test_few_columns_tiles_boundaries(m, n, k, rule):
    assert _planned(m, n, k)[1].rule == rule


@pytest.mark.parametrize("m,n,k,batch,a_t,rule", [
    (7021, 3497, 4, 1, False, "tiled"),            # K = 4: the loads outweigh the stores
    (7021, 3497, 3, 1, True, "tiled"),             # A m-contiguous: strided broadcasts of A's rows
    (2048, 4095, 3, 1, False, "tiled"),            # just short of 2^23 elements of C
    (2048, 2048, 3, 2, False, "outer-products"),   # ... which a batch counts whole
    (1 << 20, 16, 2, 1, False, "short-k"),         # few columns stay on short-k's tiles
])
def test_outer_products_boundaries(m, n, k, batch, a_t, rule):
    assert _planned(m, n, k, batch, a_t=a_t)[1].rule == rule


def test_high_takes_ozaki_ii_only_above_its_threshold(monkeypatch):
    from fastmm._plan import Device, Problem, RuleName, choose
    """'high' chooses Ozaki scheme II for single products with every side >= 8192 on Hopper,
    named by its own rule; below that, the plan of every bench shape is what it was without the rule."""
    from fastmm._plan import precision, table
    from fastmm._tools.bench import SHAPES

    big = Problem(8192, 8192, 8192)
    choice = choose(big, Device(), precision="high")
    assert choice.rule == RuleName.OZAKI and choice.name == "int8wg_128x256x128_s4_mod"
    assert "ozaki-ii: 7 moduli" in fastmm.explain((8192, 8192), (8192, 8192), precision="high")
    assert choose(big, Device(compute_capability=(8, 0)), precision="high").rule != RuleName.OZAKI
    assert choose(big, Device(), precision="highest").rule != RuleName.OZAKI
    for m, n, k in ((8192, 8191, 8192), (4096, 4096, 4096), (65536, 16384, 4096)):
        assert choose(Problem(m, n, k), Device(), precision="high").rule != RuleName.OZAKI
    assert choose(Problem(16384, 16384, 16384), Device(), precision="high").rule == RuleName.OZAKI
    assert choose(Problem(8192, 8192, 8192, batch=2), Device(), precision="high").rule != RuleName.OZAKI
    assert choose(Problem(16384, 16384, 200000), Device(), precision="high").rule != RuleName.OZAKI  # K past int32's
    below = [s for s in SHAPES if min(s.m, s.n, s.k) < 8192 or s.batch > 1]  # the bench shapes below the threshold
    with_rule = [choose(Problem(s.m, s.n, s.k, s.batch, s.a_t), Device(), "auto", precision="high") for s in below]
    monkeypatch.setattr(table, "_ozaki", lambda p, d: False)
    table._tuned._memo.clear()
    without = [choose(Problem(s.m, s.n, s.k, s.batch, s.a_t), Device(), "auto", precision="high") for s in below]
    table._tuned._memo.clear()
    assert with_rule == without and below


def test_ozaki_can_be_forced_at_any_size():
    from fastmm._plan import Device, Problem, RuleName, choose
    assert "ozaki" in fastmm.kernel_names()
    choice = choose(Problem(5, 7, 3), Device(), "ozaki")
    assert choice.rule == RuleName.FORCED and choice.name == "int8wg_128x256x128_s4_mod"
    with fastmm.use_kernel("ozaki"):
        text = fastmm.explain((100, 300), (300, 50))
    assert "Ozaki scheme II was requested" in text and "8 moduli" in text and "exact in int32" in text


def test_ozaki_falls_back_to_3xtf32_out_of_memory():
    from fastmm._plan import Device, Problem, choose
    from fastmm._plan import after_out_of_memory

    problem = Problem(16384, 16384, 16384)
    choice = choose(problem, Device(), precision="high")
    assert after_out_of_memory(problem, Device(), choice).name == "tf32x3wg_128x128x32_s3"


def test_every_rules_text_has_its_numbers_filled_in():
    """A rule's text is what `explain` prints: a `{name}` left in it is a continuation line that lost its f prefix."""
    for rule in _plan.RULES:
        assert "{" not in rule.reason and "}" not in rule.reason, (rule.name, rule.reason)
    few = next(r for r in _plan.RULES if r.name == "few-columns")
    assert "below 2^24 multiply-adds" in few.reason


def test_few_column_lanes_add_at_most_384_terms_in_single_products():
    """A long K on the few-column kernel takes slices (over a cluster, more waves if need be, or summed by the
    slice-sum kernel) so that no lane's running sum passes 384 terms: 6457x15x13544 with A m-contiguous (1693 terms
    a lane unsplit) had 1.9x cuBLAS's error."""
    from fastmm._plan.runs import run_of

    p, c = _planned(6457, 15, 13544, a_t=True)
    assert (c.rule, c.name, c.splits) == ("few-columns", "fewcol_n16_c8", 1)
    rng = np.random.default_rng(7)
    seen = 0
    for _ in range(3000):
        few, k = int(rng.integers(1, 33)), int(np.exp(rng.uniform(np.log(64), np.log(200000))))
        many = int(np.exp(rng.uniform(np.log(64), np.log(100000))))
        m, n = (few, many) if rng.random() < 0.3 else (many, few)
        p, c = _planned(m, n, k, a_t=bool(rng.random() < 0.5), b_t=bool(rng.random() < 0.5))
        if c.rule in ("few-columns", "wide-few-columns"):
            seen += 1
            assert run_of(c.config, -(-k // c.splits), c.variant.a_t) <= 384, (m, n, k, c.name, c.splits)
    assert seen > 500


def test_a_swapped_medium_product_counts_the_blocks_it_launches_and_k_of_one_is_not_swapped():
    """A @ B with B along N runs as C^T = B^T A^T (`_maprb`): its grid is of (n, m) tiles; with K = 1 the runtime
    does not swap (no map of a K x M view one row deep), and the plan does not say it does."""
    p = _plan.Problem(4096, 600, 4096, aligned=True, a_aligned=True, b_aligned=True)
    choice = _plan.choose(p, precision="medium")
    assert choice.name.endswith("_maprb")
    bm, bn = choice.config.tile
    assert p.blocks(choice.config) == -(-600 // bm) * -(-4096 // bn) != p.tiles(choice.config)
    from fastmm._plan import precision

    assert precision._maps(_plan.Problem(16384, 16384, 1, aligned=True, a_aligned=True, b_aligned=True)) == "a"


@pytest.mark.parametrize("m,n,k,batch,name", [
    (1, 1, 1, 1, "naive_32x8_f64sum"), (1, 8299, 10, 1, "naive_32x8_f64sum"), (442, 258, 17, 1, "naive_32x8_f64sum"),
    (64, 8, 3, 64, "naive_32x8_f64sum"), (30, 51, 16, 1, "naive_32x8_f64sum"), (30, 51, 17, 1, "naive_32x8_f64dot"),
    (30, 51, 96, 1, "naive_32x8_f64dot"), (7, 16, 97, 1, "naive_32x8_f64dot"), (2, 25, 766, 1, "naive_32x8_f64dot"), (1, 1, 2048, 1, "naive_32x8_f64dot"),
    (8, 59, 1612, 1, "naive_32x8_f64dot"),
])
def test_small_products_sum_in_float64(m, n, k, batch, name):
    """At most 2^21 multiply-adds and K <= 2048: bound by the launch, so float64 sums cost nothing and C is the exact
    product rounded once; a warp per element (its lanes sharing K) from K = 17 where the warps fit, else a thread per
    element up to K = 96 (442x258x17: 117 Ki warps)."""
    c = choose(m, n, k, batch)
    assert (c.rule, c.name, c.splits) == ("small", name, 1)
    assert _plan.serial_run(c, _plan.Problem(m, n, k, batch)) == 1  # one float32 rounding, C's
    for precision in ("high", "medium"):  # tensor cores gain nothing on a launch-bound product
        assert _plan.choose(_plan.Problem(m, n, k, batch), H100, precision=precision).name == name


@pytest.mark.parametrize("m,n,k,batch,rule", [
    (1, 1, 4097, 1, "few-columns"),        # K past 4096: a warp's lanes would walk over 128 steps each
    (1024, 1024, 2, 1, "tiled"),            # 2^21 multiply-adds, but 2^20 elements of C: the tiles store C faster
    (1025, 1024, 2, 1, "tiled"),
    (128, 128, 129, 1, "tiled"),            # just past 2^21 multiply-adds
    (64, 64, 64, 9, "tiled"),               # the batch counts
])
def test_larger_products_are_not_small(m, n, k, batch, rule):
    c = choose(m, n, k, batch)
    assert c.rule != "small" and c.rule == rule, (c.rule, c.name)


@pytest.mark.parametrize("m,n,k,batch", [
    (131072, 1, 16, 1),  # 2^21 multiply-adds in 2^17 elements, but 32 threads a row: 4M threads
    (4096, 1, 500, 1),   # under 2^21 multiply-adds, but a warp per element: 32K warps
])
def test_the_small_rule_stays_within_the_threads_it_was_measured_on(m, n, k, batch):
    """The small rule counts what its kernels launch (a thread per element in blocks of 8 x 32, a warp per element
    in blocks of 8 columns), not only the elements of C: past what the probe found free it does not apply."""
    from fastmm._plan import table

    assert m * n * k <= table._SMALL_MACS and m * n <= table._SMALL_OUTPUTS
    assert choose(m, n, k, batch).rule != "small"


def test_the_small_rule_shrinks_where_float64_is_slow():
    """On GPUs whose float64 runs at 1/32-1/64 of float32 (GeForce, L4, T4) the float64 sums take 1/8 of the
    multiply-adds: 256x256x16 (2^20) is small on an H100, not on an L4 (compute capability 8.9)."""
    l4 = dataclasses.replace(H100, compute_capability=(8, 9), name="L4-like")
    problem = _plan.Problem(256, 256, 16)
    assert _plan.choose(problem, H100).rule == "small"
    assert _plan.choose(problem, l4).rule != "small"
    assert _plan.choose(_plan.Problem(64, 64, 16), l4).rule == "small"  # 2^16: still small there


def test_the_small_rule_is_not_tuned_away(monkeypatch):
    """An autotuned entry times speed alone; the small rule's float64 sums are its accuracy, kept."""
    from fastmm._plan import table
    monkeypatch.setattr(table, "tuned_entries", lambda device: {table.tune_bucket(_plan.Problem(30, 30, 30)): {
        "kernel": "warptile_64x64x16_32x32_8x4_s4_tsum4", "tflops": 9.0, "heuristic_tflops": 1.0,
        "heuristic": "naive_32x8_f64dot"}})
    _plan.tuned._memo.clear()
    try:
        assert choose(30, 30, 30).name == "naive_32x8_f64dot"
    finally:
        _plan.tuned._memo.clear()


def test_17_to_32_rows_or_columns_keep_their_fp32_plan_in_every_precision():
    """The narrow tiles and the 32-column kernel are bound by memory or by their split, as split-K and the few-column
    kernel are: "high" and "medium" keep them (FP32 FMAs, their short sums), not one TF32 tile walking all of K."""
    for m, n, k, rule in ((18, 3622, 9839, "narrow-tiles"), (20, 500, 5000, "wide-few-columns")):
        for precision in ("high", "medium"):
            c = _plan.choose(_plan.Problem(m, n, k), H100, precision=precision)
            assert c.rule == rule and c.config.precision == "highest", (precision, c.rule, c.name)
            assert _plan.serial_run(c, _plan.Problem(m, n, k)) <= 256


@pytest.mark.parametrize("m,n,k,ahead", [
    (18, 3622, 9839, True), (23, 3567, 11324, True),  # few rows, short of 4096 columns: cuBLAS ahead
    (8000, 20, 9000, True),                            # few columns (128x32 tiles)
    (25, 4096, 4096, False), (19, 12000, 6000, False),  # few rows past 4096 columns and K: the narrow tiles ahead
])
def test_the_narrow_tiles_yield_to_cublas_where_it_was_measured_ahead(m, n, k, ahead):
    problem = _plan.Problem(m, n, k)
    choice = _plan.choose(problem)
    assert choice.rule == "narrow-tiles"
    why = _plan.cublas_ahead(problem, choice, _plan.Device())
    assert (why is not None and why.startswith("narrow output")) == ahead, why


def test_batches_of_few_columns_stay_within_the_running_sum_bound_without_clusters():
    """A batch on a GPU without thread-block clusters walks K whole on the few-column kernel, its lanes' sums within
    the running-sum bound: 4 terms a step in one sum (12 x 10 x 57023 on 16 columns: 1784), restarted every 8 steps up
    to 8 columns (8 x 5 x 57023: 56 blocks of 32 terms) or, where a lane owns a row (5 x 8 x 57023, A of the transposed
    product m-contiguous), every 2 steps (223 blocks of 32 terms)."""
    a100 = dataclasses.replace(H100, compute_capability=(8, 0), name="A100-like", max_smem_optin=163 * 1024,
                               sm_count=108)
    for m, n, run in ((12, 10, 4 * 446), (8, 5, 56), (5, 8, 223)):
        p = _plan.Problem(m, n, 57023, batch=5)
        c = _plan.choose(p, a100)
        assert c.rule == "few-columns" and _plan.serial_run(c, p, a100) == run, (m, n, c.name)
        assert _plan.choose(p, H100).rule == "few-columns"


@pytest.mark.parametrize("m,n,k,tile", [(163, 174, 6204, (64, 64)), (426, 297, 14912, (64, 64)),
                                        (322, 269, 14886, (128, 64)), (128, 128, 65536, (128, 64))])
def test_split_k_slices_keep_to_four_warp_tiles_where_128x64_pads_more(m, n, k, tile):
    """163 x 174: 58% of the 128x64 tiles' area inside C against 77% of the 64x64 ones' (0.88x against 1.23x cuBLAS)."""
    p, c = _planned(m, n, k)
    assert (c.rule, c.config.tile) == ("split-k", tile)
    assert c.splits > 1


def test_a_lane_with_one_running_sum_takes_slices_of_at_most_160_terms():
    """9-16 columns with A row-major keep one running sum a lane (4 terms a step): past 160 terms the product takes a
    cluster's slices (5 x 4963 x 5899 with B^T, on 16 columns: 188 terms unsplit had 1.79x cuBLAS's error), where a
    lane that owns a row folds its sums and keeps the 384-term walk. Up to 8 columns every lane folds: no slices."""
    for p in (_plan.Problem(10, 4963, 5899, b_t=True), _plan.Problem(4963, 10, 5899)):
        c = _plan.choose(p)
        assert c.config.name == "fewcol_n16_c2" and _plan.serial_run(c, p) == 96, (p, c.config.name)
    for p in (_plan.Problem(5, 4963, 5899, b_t=True), _plan.Problem(4963, 5, 5899)):
        c = _plan.choose(p)
        assert c.config.name == "fewcol_n8" and _plan.serial_run(c, p) == 32, (p, c.config.name)
    p = _plan.Problem(4963, 10, 4991)  # 39 steps: 156 terms
    assert _plan.choose(p).config.name == "fewcol_n16" and _plan.serial_run(_plan.choose(p), p) == 156
    p = _plan.Problem(4963, 10, 4991, a_t=True)  # lanes own rows: 624 terms walked, in blocks of 32
    assert _plan.choose(p).config.name == "fewcol_n16_c2" and _plan.serial_run(_plan.choose(p), p) == 32


def test_split_cut_leaves_whole_steps_or_a_short_last_slice():
    """Split-K's cut: whole 16-deep slices and the rest as a launch of its own, except on the unrolled tiles, which
    take ceil(k / splits) deep slices with a last one short of them (ending at K: nothing left over); the loops keep
    whole steps."""
    from fastmm.kernels import configs

    assert _plan.split_cut(7157, 27) == (256, 27, 245)
    assert _plan.split_cut(7157, 27, configs.WT64) == (266, 27, 0)          # the last 241 deep: 17 K-tiles in series
    assert _plan.split_cut(7157, 27, configs.WT256_SLICES) == (256, 27, 245)  # the loop: whole K-tiles
    assert _plan.split_cut(3074, 2, configs.WT64) == (1537, 2, 0)
    assert _plan.split_cut(4096, 4, configs.WT64) == (1024, 4, 0)           # the same cut either way
    assert _plan.split_cut(4128, 2, configs.WT64) == (2064, 2, 0)
    assert _plan.split_cut(100, 9, configs.WT64) == (8, 9, 28)              # K // 9 < 16: whole steps, as the loops
    for k in range(256, 3000, 7):
        for splits in (2, 3, 5, 8, 13, 27):
            depth, slices, rest = _plan.split_cut(k, splits, configs.WT64)
            if k // splits < 16:  # shallower than a K-tile: whole steps
                assert depth * slices + rest == k and depth % 8 == 0 and slices <= splits
                continue
            assert rest == 0 and (slices - 1) * depth < k <= slices * depth and slices <= splits
            assert depth - (k - (slices - 1) * depth) < splits  # the last slice: short by fewer values than splits


def test_explain_shows_the_cut_of_k():
    """`explain` states split-K's cut as the runtime makes it: the slices' count and depth, a last slice short of the
    others, and what K leaves over."""
    a = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (399, 11639), (4 * 11639, 4))
    b = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (11639, 137), (4 * 137, 4))
    text = fastmm.explain(a, b)
    assert "split-K into 12 slices 970 deep (the last 969)\n" in text, text
    # The sub-tile loop's slices: whole 16-deep steps, and the rest as a launch of its own.
    text = fastmm.explain((1000, 100000), (100000, 1000))
    assert "split-K into 4 slices 24992 deep, the last 32 of K a launch of its own\n" in text, text
    assert "split-K into 128 slices 512 deep\n" in fastmm.explain((128, 65536), (65536, 128))


@pytest.mark.parametrize("m,n,k,splits", [
    (4375, 615, 7371, 4),     # 690 tiles of 64x64 (5.2 an SM): 0.67x cuBLAS whole, 0.77x in 4 slices (measured)
    (3233, 785, 13713, 8),    # 663 tiles: 0.74x whole, 0.85x in 8
    (3418, 186, 1980, 3),     # 81 tiles of 128x64: 0.54x whole, 0.79x in 3
    (428, 1091, 642, 1),      # K under 1024: whole (a second launch measured slower on small products there)
    (960, 20299, 35097, 1),   # 36 waves of blocks: past the model's range, no workspace
    (2048, 2048, 2048, 1),    # the 128x256 sub-tile loop: not an unrolled tile
])
def test_the_tiled_rule_splits_k_where_that_evens_out_the_sms_blocks(m, n, k, splits):
    """From K = 1024, up to three waves of their blocks, the tiled rule's unrolled tiles take the slice count that
    balances the SMs' blocks (`balanced_splits`); a batch never (its items would run one after another)."""
    c = choose(m, n, k)
    assert (c.rule, c.splits) == ("tiled", splits), c
    if splits > 1:
        assert not c.config.sub_k and f"split-K into {splits} slices" in fastmm.explain((m, k), (k, n))
        assert choose(m, n, k, 2).splits == 1


def test_balanced_splits_keep_slices_128_deep_and_the_least_count():
    """Every count `balanced_splits` returns leaves slices at least 128 deep and is at least `least` (2 for the split
    rules); with no count that deep it keeps the rule's own."""
    from fastmm._plan.splits import balanced_splits
    tile = configs.get_config(_plan.tiles.WT64)
    for m, n, k in [(64, 64, 300), (300, 300, 4096), (2000, 100, 1100), (64, 4096, 65536), (5000, 5000, 1024)]:
        p = _plan.Problem(m, n, k)
        for least in (1, 2):
            s = balanced_splits(p, H100, tile, own=2, least=least)
            assert s >= least and (k // s >= 128 or s == 2), (m, n, k, least, s)
    assert balanced_splits(_plan.Problem(64, 64, 200), H100, tile, own=7) == 7  # nothing 128 deep: the rule's own

"""The bench's table, from a made-up report (no GPU): ratios against the same row's cuBLAS, gaps for skipped kernels."""

from fastmm._tools import bench
from fastmm._tools.bench import format_table


def test_table_reports_ratios_to_the_rows_cublas():
    def res(tflops, err=1e-6):
        return {"seconds": 1.0 / tflops, "tflops": tflops, "rel_error": err}

    report = {"rows": [
        {"shape": "4096^3", "results": {"cublas": res(50.0), "k1": res(25.0), "auto": res(50.5, 2e-6)},
         "auto_kernel": "k1_nn_v4"},
        {"shape": "matvec", "results": {"cublas": res(1.0), "auto": res(0.5)}, "auto_kernel": "k1 x8 K-slices"},
    ]}
    lines = format_table(report, ["k1"]).splitlines()
    assert "cublas" in lines[0] and "auto" in lines[0]
    assert "25.00 ( 0.50x cuBLAS)" in lines[2] and "50.50 ( 1.01x cuBLAS)" in lines[2] and "2.0e-06" in lines[2]
    assert lines[3].split("|")[3].strip() == "-"          # k1 skipped on this row
    assert "0.50 ( 0.50x cuBLAS)" in lines[3] and lines[3].rstrip().endswith("k1 x8 K-slices |")


def test_shapes_outside_the_table_are_written_m_n_k():
    """`bench --shapes 64x4096x4096` measures a shape the table lacks (A m x k, B k x n); other labels stay errors."""
    shape = bench._shape_of("64x4096x1000")
    assert (shape.m, shape.n, shape.k, shape.batch, shape.a_t, shape.label) == (64, 4096, 1000, 1, False, "64x4096x1000")
    for label in ("64x4096", "0x1x1", "ax1x1", "4096^3", "1x2x3x4"):
        assert bench._shape_of(label) is None, label

"""The bench's table, from a made-up report (no GPU): ratios against the same row's cuBLAS, gaps for skipped kernels."""

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

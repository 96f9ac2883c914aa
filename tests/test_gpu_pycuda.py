"""PyCUDA programs and fastmm share GPU memory without copies (docs/pycuda.md). In a child process: a context
mix-up can abort the interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

CODE = textwrap.dedent("""
    import numpy as np
    import pycuda.autoprimaryctx  # noqa: F401  PyCUDA on the primary context, the one CuPy and fastmm use
    import pycuda.driver as drv
    import pycuda.gpuarray as gpuarray
    from pycuda.compiler import SourceModule
    import cupy as cp
    import fastmm

    ctx = drv.Context.get_current()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((200, 100)).astype(np.float32)
    ga, gb = gpuarray.to_gpu(a), gpuarray.to_gpu(b)
    fa, fb = fastmm.asarray(ga), fastmm.asarray(gb)
    assert type(fa) is fastmm.ndarray
    assert fa.data.ptr == int(ga.gpudata) and fb.data.ptr == int(gb.gpudata)  # no copies
    c = fa @ fb
    cp.cuda.get_current_stream().synchronize()  # PyCUDA's work below is on its own stream
    gc = gpuarray.GPUArray(c.shape, np.float32, gpudata=c.data.ptr, base=c)  # back to PyCUDA, no copy
    twice = SourceModule(
        "__global__ void twice(float *x, int n)"
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }").get_function("twice")
    twice(np.intp(c.data.ptr), np.int32(c.size), block=(256, 1, 1), grid=((c.size + 255) // 256, 1))
    drv.Context.synchronize()
    want = 2 * (a.astype(np.float64) @ b.astype(np.float64))
    got = gc.get()
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.array_equal(cp.asnumpy(c), got)  # fastmm's array sees PyCUDA's write: the same memory
    assert drv.Context.get_current() == ctx  # PyCUDA's context is still current
    print("ok")
""")


def test_pycuda_arrays_go_in_and_results_come_back_without_copies():
    pytest.importorskip("pycuda", reason="PyCUDA is not installed: pip install 'fastmm[pycuda]'")
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr

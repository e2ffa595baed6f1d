"""`kernels.offline`: a launch compiled for the H200 (sm_90) on this CPU machine, as the JIT would
compile it there, and the compiler's own account of it (registers, spills, loops in the SASS).

These need no GPU: Triton's wheel carries ptxas and cuobjdump. The kernel tests' conftest has
Triton interpret every kernel, and an interpreted kernel cannot be compiled, so each test runs in
a fresh Python with TRITON_INTERPRET=0 (`_compiled`). The last test pins what this Triton compiles
of the engine's verification tile (bench/NOTES.md version 57)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compiled(test_name: str) -> None:
    """Run this module's function ``test_name`` in a Python whose kernels are compiled."""
    code = textwrap.dedent(f"""
        import tests.kernels.test_offline as t
        t.{test_name}()
    """)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


if os.environ.get("TRITON_INTERPRET") == "0":
    import torch
    import triton
    import triton.language as tl

    from kernels.offline import compile_launch, record, sass_stats

    @triton.jit
    def _row_sums(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
        """One program per row: the row's first n elements summed, BLOCK at a time."""
        row = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + row * n * stride + offs * stride, mask=offs < n, other=0.0)
        tl.store(out_ptr + row, tl.sum(acc))

    class _Module:
        row_sums = _row_sums



def _launch(stride):
    x, out = torch.zeros(4, 256), torch.zeros(4)
    with record(_Module, "row_sums") as (kernel, launches):
        _Module.row_sums[(4,)](x, out, 256, stride, BLOCK=128, num_warps=1)
    assert _Module.row_sums is kernel            # put back after the block
    [launch] = launches
    assert launch.grid == (4,) and launch.kwargs["BLOCK"] == 128
    return compile_launch(kernel, launch)


def test_a_launch_compiles_for_sm90_as_the_jit_specialises_it():
    _compiled("launch_compiles_as_the_jit_specialises_it")


def launch_compiles_as_the_jit_specialises_it():
    """Stride 1 is specialised to a constant as the JIT does on the device, so the loads
    vectorise (128-bit); stride 2 cannot. The SASS's one loop is found, with its global loads."""
    unit, strided = _launch(1), _launch(2)
    assert "ld.global.v4" in unit.asm["ptx"] and "ld.global.v4" not in strided.asm["ptx"]
    for compiled in (unit, strided):
        st = sass_stats(compiled)
        assert 0 < st.registers <= 255 and st.stack == 0
        assert st.mma == []                       # no dot in this kernel
        assert st.main_loop is not None and st.main_loop.ops["LDG"] >= 1
        assert st.main_loop.ops["HMMA"] == 0 and st.instructions > st.main_loop.instructions


def test_the_engines_verification_tile_syncs_its_warps_every_key_tile():
    _compiled("the_engines_verification_tile_syncs_its_warps_every_key_tile")


def the_engines_verification_tile_syncs_its_warps_every_key_tile():
    """The engine's verification at SmolLM2's shape, 10 rows (vegas's gamma 9), no collection: the
    2-D tile's chained products put the 4 warps along the keys (warpsPerCTA [1, 4]), so every
    128-key tile reduces its softmax across warps and passes P through shared memory (8 or more
    barriers a tile), without spills. (bench/NOTES.md versions 57 and 59: a kernel that took these
    steps out of the loop ran slower on the GPU, so they are not what bounds it.)"""
    from vegas_core.bench.sass import engine_launch
    _, _, compiled = engine_launch("smollm2", 10, "none")
    st = sass_stats(compiled)
    assert any("warpsPerCTA = [1, 4]" in m for m in st.mma)
    assert st.main_loop.ops["BAR"] >= 8 and st.main_loop.ops["STS"] > 0
    assert st.main_loop.ops["HMMA"] > 0 and st.main_loop.ops["LDL"] == 0

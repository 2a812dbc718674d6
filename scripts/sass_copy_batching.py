"""Does ptxas keep a row copy's loads together when the CUDA source issues them all first?

Builds polytile's default softmax and layernorm (2048x4096 fp32) for sm_90a twice: as generated (the
copy loop stores each 16-byte load to shared memory right away) and with the copy loop split so that
all eight loads go to a register array before the eight stores. Prints, for each, the order of
the row copy's LDG/STS in the first basic block. No GPU needed (nvcc and nvdisasm).
    .venv/bin/python scripts/sass_copy_batching.py
(2026-11-25, nvcc 13.0: every order comes out in batches with reused registers — softmax 4 loads,
4 stores, 4 loads, 4 stores as generated and 5, 3, 3, 5 from the split source; layernorm 5, 2, 3, 6
both ways — see docs/sass.md.)
"""

import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from polytile import ops
from polytile.sass import polytile_launch
from polytile.sass.api import analyse
from polytile.sass.launch import CubinLaunch
from polytile.toolchain import arch_flags, nvcc

COPY = re.compile(
    r"( *)#pragma unroll\n *for \(int (\w+) = 0; \2 < 8; \+\+\2\) \{\n *\{\n *(const int \w+ = [^\n]*;)\n"
    r" *\*\(uint4\*\)&(\w+\[[^\n]*?\]) = (\*\(const uint4\*\)&[^\n]*);\n *\}\n *\}\n"
)


def split_copy(source: str) -> str:
    """`source` with its eight-load row copy issued as eight loads, then eight stores."""
    m = COPY.search(source)
    if m is None:
        raise SystemExit("the row copy loop was not found in the generated source")
    ind, k, index, dst, load = m.groups()
    loop = f"{ind}#pragma unroll\n{ind}for (int {k} = 0; {k} < 8; ++{k}) {{ {index} "
    split = f"{ind}uint4 pt_r[8];\n{loop}pt_r[{k}] = {load}; }}\n{loop}*(uint4*)&{dst} = pt_r[{k}]; }}\n"
    return source[: m.start()] + split + source[m.end() :]


def nvcc_cubin(source: str) -> bytes:
    out = Path(tempfile.mkdtemp())
    (out / "k.cu").write_text(source)
    cubin, cu = out / "k.cubin", out / "k.cu"
    subprocess.run([nvcc(), "-cubin", "-O3", *arch_flags("sm_90a"), "-o", str(cubin), str(cu)], check=True)
    return cubin.read_bytes()


def copy_order(launch: CubinLaunch) -> str:
    a = analyse(launch)
    block = a.blocks[0]
    copies = [a.instructions[i] for i in range(block.start, block.end)]
    return " ".join(  # each 16-byte load or store with its data register
        f"{ins.base}:{ins.text.split()[1 if ins.base == 'LDG' else 2].rstrip(',')}"
        for ins in copies
        if ins.base in ("LDG", "STS") and "128" in ins.text
    )


def main() -> None:
    rng = np.random.default_rng(0)
    rows = (("softmax", ops.softmax(2048, 4096, "float32")), ("layernorm", ops.layernorm(2048, 4096, "float32")))
    for name, op in rows:
        kern = op.build("cuda:sm_90a")
        launch = polytile_launch(kern, op.make_inputs(rng), name=name)
        split = launch.with_cubin(nvcc_cubin(split_copy(kern.source)))
        print(f"{name} as generated: {copy_order(launch)}")
        print(f"{name} loads first:  {copy_order(split)}")


if __name__ == "__main__":
    main()

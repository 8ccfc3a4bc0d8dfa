"""The real sm_90 compile behind the kernels' compile checks: Triton to PTX for an H200, then the
bundled ptxas for the register and spill report. Imported by the check scripts that
`helpers.run_sm90_compile_check` runs in a fresh interpreter (with tests/ on the path)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_sm90(fn, signature: dict, constants: dict, attrs: dict | None = None, num_warps: int = 4,
                 num_stages: int = 1, maxnreg: int | None = None) -> tuple[str, str]:
    """(PTX, `ptxas -v` report) of the Triton kernel `fn` for sm_90a. Constants missing from
    `signature` are marked constexpr; `attrs` are ASTSource attributes (e.g. divisibility);
    `maxnreg` caps the registers per thread as the launch option of that name does. Constexpr
    parameters with a default that `constants` leaves out take it, as a launch would."""
    constants = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default
                    and p.name not in constants and signature.get(p.name, "constexpr") == "constexpr"},
                 **constants}
    sig = {**signature, **{k: "constexpr" for k in constants if k not in signature}}
    src = triton.compiler.ASTSource(fn, sig, constants, attrs or {})
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        options["maxnreg"] = maxnreg
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                           capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    return ptx, r.stdout + r.stderr


def sass_sm90(ptx: str) -> list[tuple[str, list[str]]]:
    """The sm_90a SASS of a PTX module (the bundled ptxas, then the bundled nvdisasm) as
    (opcode, operands) per instruction in program order, predicates dropped: where a property is
    decided by ptxas (e.g. an atomic's result read at once or late)."""
    with tempfile.TemporaryDirectory() as d:
        src, cubin = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        subprocess.run([PTXAS, "--gpu-name", "sm_90a", src, "-o", cubin], capture_output=True, check=True)
        text = subprocess.run([os.path.join(os.path.dirname(PTXAS), "nvdisasm"), "-c", cubin],
                              capture_output=True, text=True, check=True).stdout
    out = []
    for line in text.splitlines():
        if not re.match(r"\s*/\*[0-9a-f]{4}\*/", line):       # an instruction's address
            continue
        ins = re.sub(r"^@!?U?P\w+ ", "", line.split("*/", 1)[1].split(";")[0].strip()).split(" ", 1)
        out.append((ins[0], [o.strip() for o in ins[1].split(",")] if len(ins) > 1 else []))
    return out


def signature(fn, ptrs: dict, ints, floats=()) -> dict:
    """fn's Triton signature: `ptrs` name -> pointer type, `ints` i32, `floats` fp32, the rest
    constexpr."""
    return {n: ptrs.get(n) or ("i32" if n in ints else "fp32" if n in floats else "constexpr")
            for n in fn.arg_names}


def divisible_by_16(fn, names) -> dict:
    """ASTSource attributes declaring `names` 16-divisible (aligned pointers, strides), as the
    launcher's specialisation sees them at the model's shapes."""
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}

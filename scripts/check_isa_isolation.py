#!/usr/bin/env python3
"""Checks that a binary runs on any x86-64-v2 CPU until it dispatches.

klserve's CPU kernels are compiled once per ISA variant, each in its own
namespace klserve::cpu::<variant> (kernels/cpu/isa.h); everything else is
compiled for the x86-64-v2 baseline. This disassembles the binaries given
and fails if an instruction that the baseline does not have appears outside
the variants allowed to use it:

  - EVEX-encoded instructions (AVX-512) only in klserve::cpu::avx512::
  - VEX-encoded instructions (AVX, AVX2, FMA, F16C, BMI) only there or in
    klserve::cpu::avx2::

The encoding is read from the instruction's first bytes: in 64-bit mode a
0x62 opcode byte is always an EVEX prefix and 0xc4/0xc5 always a VEX one, so
no list of mnemonics is needed.

Usage: check_isa_isolation.py BINARY...
"""

import re
import subprocess
import sys

FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
# "  4011e6:\t62 f1 7c 48 28 c1 \tvmovaps %zmm1,%zmm0"
INSTRUCTION = re.compile(r"^\s*[0-9a-f]+:\t([0-9a-f ]+)\t(\S.*)$")
# Prefixes that may stand before a VEX or EVEX prefix: only the address-size
# override is allowed there (and segment overrides, which compilers do not
# emit in front of vector code but cost nothing to skip).
SKIPPABLE_PREFIXES = {"67", "26", "2e", "36", "3e", "64", "65"}

ALLOWED = {
    "EVEX (AVX-512)": ("klserve::cpu::avx512::",),
    "VEX (AVX/AVX2/FMA)": ("klserve::cpu::avx2::", "klserve::cpu::avx512::"),
}


def encoding(raw_bytes):
    for byte in raw_bytes.split():
        if byte in SKIPPABLE_PREFIXES:
            continue
        if byte == "62":
            return "EVEX (AVX-512)"
        if byte in ("c4", "c5"):
            return "VEX (AVX/AVX2/FMA)"
        return None
    return None


def check(binary):
    disassembly = subprocess.run(
        ["objdump", "-d", "-C", "--insn-width=16", binary],
        check=True, capture_output=True, text=True).stdout
    function = "?"
    offenders = {}  # (function, encoding) -> (count, first instruction)
    counts = {kind: 0 for kind in ALLOWED}
    for line in disassembly.splitlines():
        header = FUNCTION.match(line)
        if header:
            function = header.group(1)
            continue
        instruction = INSTRUCTION.match(line)
        if not instruction:
            continue
        kind = encoding(instruction.group(1))
        if kind is None:
            continue
        counts[kind] += 1
        if any(namespace in function for namespace in ALLOWED[kind]):
            continue
        count, first = offenders.get((function, kind), (0, instruction.group(2)))
        offenders[(function, kind)] = (count + 1, first)
    for kind, count in counts.items():
        print(f"{binary}: {count} {kind} instructions")
    for (function, kind), (count, first) in sorted(offenders.items()):
        print(f"{binary}: {count} {kind} instructions outside their variant in "
              f"{function}, the first: {first}")
    if counts["EVEX (AVX-512)"] == 0:
        # The AVX-512 variant must be there at all, or this checks nothing.
        print(f"{binary}: no AVX-512 instructions at all: is the avx512 "
              "variant missing?")
        return False
    return not offenders


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    ok = all([check(binary) for binary in argv[1:]])
    print("ISA isolation: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

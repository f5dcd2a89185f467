"""tools/moejit-mca against real listings of moejit-dump.

What it reads from a listing is checked without llvm-mca: the inner loops
(q2_K's per-row scale pass and its K loop on Intel, mxfp4's scale widening
loop kept out of the weight bytes), the weight bytes per iteration, the
phases, and the rewrites (zero idioms, two FMA units, vdpbf16ps's ports).
Where llvm-mca of LLVM 17 or later is installed, the tool's report is
checked too; without it that part says it is skipped.

Usage: check_moejit_mca.py --tool tools/moejit-mca --dump build/tools/moejit-dump
"""

import argparse
import importlib.machinery
import importlib.util
import subprocess
import sys


def load(path):
    loader = importlib.machinery.SourceFileLoader("moejit_mca", path)
    spec = importlib.util.spec_from_loader("moejit_mca", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def listing(dump, args):
    return subprocess.run([dump] + args.split(), capture_output=True, text=True, check=True).stdout


def expect(cond, what):
    if not cond:
        print("FAIL: " + what)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--dump", required=True)
    a = ap.parse_args()
    mca = load(a.tool)
    k = "--k 2048 --rows 64 --tokens 1 --isa avx512_bf16"
    probe = subprocess.run([a.dump, "--format", "q2_K"] + k.split(), capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: moejit-dump cannot list avx512_bf16 kernels here: " + probe.stderr.strip())
        return 77

    # q2_K on Intel (fp32 decode): a per-row pass over the super-blocks' scales
    # before the K loop; both step r9 one super-block (84 bytes) an iteration.
    q2 = mca.inner_loops(mca.instructions(listing(a.dump, "--format q2_K --cpu intel " + k)))
    expect(len(q2) == 2, "q2_K: two inner loops, found %d" % len(q2))
    expect([mca.weight_bytes(b) for _, _, b, _ in q2] == [84, 84], "q2_K: 84 weight bytes per iteration")
    expect(q2[0][3] == ["prologue"] and q2[1][3] == ["decode", "fma", "block-scale"], "q2_K: phases %s" % [p for *_, p in q2])
    expect(q2[1][2][-1] == "dec rax", "q2_K: the K loop's body ends at its counter: %s" % q2[1][2][-1])

    # mxfp4: the widening loop steps r9 over scales, the K loop over weights.
    mx = mca.inner_loops(mca.instructions(listing(a.dump, "--format mxfp4 --cpu intel " + k)))
    expect([p for *_, p in mx][0] == ["widen"], "mxfp4: the first loop widens scales: %s" % mx[0][3])
    expect(mca.weight_bytes(mx[1][2]) == 64, "mxfp4: 64 weight bytes per K iteration")

    # Zero idioms become loads the model sees as independent; other xors stay.
    src = mca.model_source(["vxorps zmm10, zmm10, zmm10", "vxorps zmm1, zmm2, zmm2", "vpxord zmm3, zmm3, zmm3"])
    expect("vmovaps zmm10, zmmword ptr [rsp - 64]" in src and "vxorps zmm1, zmm2, zmm2" in src and
           "vmovaps zmm3," in src, "zero idioms rewritten: " + src)

    # Two 512-bit FMA units (the Xeon server): FMAs, multiplies and vcvtdq2ps
    # become instructions of ports 0 and 5 with the same operands; not with --one-fma.
    body = ["vfmadd231ps zmm10, zmm0, zmmword ptr [r10+0x40]", "vfnmadd231ps zmm12, zmm0, dword ptr [rbx]{1to16}",
            "vmulps zmm4, zmm4, zmm2", "vcvtdq2ps zmm4, zmm5", "vfmadd231ps ymm1, ymm2, ymm3"]
    two = mca.model_source(body, True)
    for want in ("vpternlogd zmm10, zmm0, zmmword ptr [r10+0x40], 0x96",
                 "vpternlogd zmm12, zmm0, dword ptr [rbx]{1to16}, 0x96", "vaddps zmm4, zmm4, zmm2",
                 "vpaddd zmm4, zmm5, zmm5", "vfmadd231ps ymm1, ymm2, ymm3"):
        expect(want in two, "two FMA units: %r missing in\n%s" % (want, two))
    expect(mca.model_source(body, False).splitlines()[1:] == body, "one FMA unit: the body unchanged")

    # vdpbf16ps as the Xeon measured it: two vpermps (port 5) into registers the
    # loop does not use, two vpermps-free vpternlogd that keep its accumulator and
    # its memory operand; LLVM's own form with --llvm-dp (measured_dp False).
    dp = ["vdpbf16ps zmm10, zmm0, zmmword ptr [r10+0x40]", "vpermps zmm31, zmm6, zmm4"]
    got = mca.model_source(dp, True, True).splitlines()[1:]
    want = ["vpermps zmm30, zmm0, zmm0", "vpermps zmm29, zmm0, zmm0",
            "vpternlogd zmm10, zmm30, zmmword ptr [r10+0x40], 0x96", "vpternlogd zmm10, zmm29, zmm30, 0x96",
            "vpermps zmm31, zmm6, zmm4"]
    expect(got == want, "vdpbf16ps as measured: %s" % got)
    expect(mca.model_source(dp, True, False).splitlines()[1:] == dp, "--llvm-dp: vdpbf16ps unchanged")

    # The report, where llvm-mca can model the Xeon's core.
    try:
        mca.find_llvm_mca(None)
    except SystemExit:
        print("llvm-mca of LLVM 17 or later not installed: the report part is skipped (apt-get install llvm-19)")
        print("OK")
        return 0
    r = subprocess.run([sys.executable, a.tool, "--dump", a.dump, "--format", "q2_K", "--cpu", "intel"] + k.split(),
                       capture_output=True, text=True)
    expect(r.returncode == 0, "moejit-mca q2_K: " + r.stderr)
    rows = [line for line in r.stdout.splitlines() if line.startswith("0x")]
    expect(len(rows) == 2 and r.stdout.splitlines()[-1].startswith("row "), "moejit-mca q2_K report:\n" + r.stdout)
    for line in rows:
        cycles, bound = float(line.split()[4]), float(line.split()[5])
        expect(0 < bound <= cycles + 0.05, "port bound at most the simulated cycles: " + line)
    bad = subprocess.run([sys.executable, a.tool, "--dump", a.dump, "--format", "q2_K", "--layer"],
                         capture_output=True, text=True)
    expect(bad.returncode == 2 and bad.stderr.startswith("moejit-mca: "), "--layer is refused: " + bad.stderr)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())

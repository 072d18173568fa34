#!/usr/bin/env python3
"""What each GPU kernel of a binary costs, read from its machine code without a GPU: registers, spills,
static shared memory, the warps per SM its registers allow, the width of its global loads and stores,
and its instruction mix. For every architecture in the binary (sm_80 and sm_90 here).

    python3 dev/cuda/kernel_report.py train_gpt2cu                  markdown tables, one per architecture
    python3 dev/cuda/kernel_report.py --check train_gpt2cu          also exit 1 on a spill not listed in
                                                                    dev/cuda/known_spills.txt (CI runs this)
    python3 dev/cuda/kernel_report.py --all train_gpt2cu            every kernel, not only the ones in llmc/

Where the numbers come from: `cuobjdump -res-usage` (REG: registers per thread, STACK: the stack frame,
SHARED: static shared memory) and `cuobjdump -sass` (the instructions). cuobjdump is looked for in
$CUOBJDUMP, on PATH, in $CUDA_HOME/bin and /usr/local/cuda/bin, and in the Triton wheel PyTorch installs
(triton/backends/nvidia/bin/, found by importing triton with the Python scripts/find_python.sh names):
the CUDA toolkit here ships nvcc without cuobjdump.

The columns:
  regs        registers per thread (ptxas's allocation)
  warps/SM    the most warps one SM can hold by registers alone: 64K registers, allocated per warp in
              units of 256 (32 threads x regs rounded up to 8), at most 64 warps (sm_80 and sm_90); blocks'
              shared memory and sizes can lower it further
  spill       local-memory instructions (LDL, STL): registers spilled, or an array the compiler could not
              keep in registers; both cost memory traffic a kernel is not meant to have
  smem        static shared memory, bytes (on sm_90 the 1 KB each block reserves for the system is
              included; dynamic shared memory is set at launch and not seen here)
  ld/st 128   global loads and stores (LDG, STG; cp.async's LDGSTS counted as loads) that move 16 bytes,
              out of all global loads and stores: the widths a memory-bound kernel wants
  tensor      tensor-core instructions (HMMA, HGMMA, IMMA), as % of all instructions
  mufu        special-function unit (exp, tanh, rcp, ...), %
  int addr    integer and address arithmetic (IMAD, IADD3, LEA, SHF, LOP3, ...), %
  fp          FFMA, FADD, FMUL, FMNMX, HFMA2 and the like, %
  ld/st       all loads and stores (global, shared, ldmatrix, local), %
Counts are static (instructions in the code, not executed): loops weigh once. Read them as the shape
of a kernel's inner loop, not its run time."""
import collections
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TENSOR = ("HMMA", "HGMMA", "IMMA", "QGMMA", "BMMA")
INT_ADDR = ("IMAD", "IADD3", "IADD", "LEA", "SHF", "LOP3", "ISETP", "IMNMX", "VIMNMX", "VIADD", "IABS", "SEL",
            "PRMT", "UIMAD", "UIADD3", "ULEA", "USHF", "ULOP3", "UISETP", "USEL", "UPRMT", "I2F", "F2I", "I2FP")
FP = ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "HFMA2", "HADD2", "HMUL2", "F2FP", "FCHK", "DFMA", "DADD",
      "DMUL")
MEMORY = ("LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "LDL", "STL", "LD", "ST", "ATOMG", "RED", "ATOMS")


def find_cuobjdump():
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates += [os.path.join(cuda, "bin", "cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:
        python = subprocess.run([os.path.join(ROOT, "scripts", "find_python.sh")], capture_output=True,
                                text=True).stdout.strip()
        triton = subprocess.run([python, "-c", "import triton, os; print(os.path.dirname(triton.__file__))"],
                                capture_output=True, text=True).stdout.strip()
        if triton:
            candidates.append(os.path.join(triton, "backends", "nvidia", "bin", "cuobjdump"))
    except OSError:
        pass
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name):
    """attention_flash_backward_dkv_kernel<128>(...) -> attention_flash_backward_dkv_kernel<128>"""
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    s = "".join(out)
    return s.replace("void ", "")


def functions(cuobjdump, option, binary):
    """cuobjdump's output for `option`, as (arch, mangled function name, line) for each line inside a
    function's section."""
    text = subprocess.run([cuobjdump, option, binary], capture_output=True, text=True).stdout
    arch, fn = None, None
    for line in text.splitlines():
        m = re.match(r"\s*arch = (sm_\d+a?)", line)
        if m:
            arch, fn = m.group(1), None
            continue
        m = re.match(r"\s*Function :? ?(\S+?):?$", line.rstrip())
        if m:
            fn = m.group(1)
            continue
        if arch and fn:
            yield arch, fn, line


def resource_usage(cuobjdump, binary):
    """{arch: {mangled: (regs, stack, shared)}}"""
    usage = collections.defaultdict(dict)
    for arch, fn, line in functions(cuobjdump, "-res-usage", binary):
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", line)
        if m:
            usage[arch][fn] = tuple(int(x) for x in m.groups())
    return usage


def instruction_mix(cuobjdump, binary):
    """{arch: {mangled: Counter of opcode -> count, plus 'g128' and 'gall'}}"""
    mix = collections.defaultdict(lambda: collections.defaultdict(collections.Counter))
    for arch, fn, line in functions(cuobjdump, "-sass", binary):
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]*)?", line)
        if not m or m.group(1) == "NOP":
            continue
        op, mods = m.group(1), m.group(2) or ""
        c = mix[arch][fn]
        c[op] += 1
        if op in ("LDG", "STG", "LDGSTS"):
            c["gall"] += 1
            if ".128" in mods:
                c["g128"] += 1
    return mix


def our_kernels():
    names = set()
    for d in (os.path.join(ROOT, "llmc"), os.path.join(ROOT, "llmc", "parallel"), os.path.join(ROOT, "llmc", "run")):
        if not os.path.isdir(d):
            continue
        for f in os.listdir(d):
            if f.endswith(".cuh"):
                text = open(os.path.join(d, f)).read()
                names.update(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", text))
    return names


def warps_by_registers(regs):
    per_warp = ((max(regs, 1) * 32 + 255) // 256) * 256
    return min(64, 65536 // per_warp)


def load_known_spills():
    path = os.path.join(ROOT, "dev", "cuda", "known_spills.txt")
    known = set()
    if os.path.exists(path):
        for line in open(path):
            line = line.split("#", 1)[0].strip()
            if line:
                known.add(line)
    return known


def main(argv):
    check = "--check" in argv
    every = "--all" in argv
    binaries = [a for a in argv if not a.startswith("--")]
    if not binaries:
        print(__doc__, file=sys.stderr)
        return 2
    cuobjdump = find_cuobjdump()
    if not cuobjdump:
        print("kernel_report: cuobjdump not found (CUOBJDUMP, PATH, CUDA_HOME/bin, the triton wheel)", file=sys.stderr)
        return 1
    ours = our_kernels()
    known = load_known_spills()
    unexpected = []
    for binary in binaries:
        usage, mix = resource_usage(cuobjdump, binary), instruction_mix(cuobjdump, binary)
        if not mix:
            print(f"kernel_report: no device code in {binary}", file=sys.stderr)
            return 1
        names = demangle(sorted({fn for a in mix.values() for fn in a}))
        print(f"# {binary} (cuobjdump: {cuobjdump})\n")
        for arch in sorted(mix):
            print(f"## {arch}\n")
            print("| kernel | regs | warps/SM | spill | smem | ld/st 128 | tensor | mufu | int addr | fp | ld/st | instrs |")
            print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            rows = []
            for fn, c in mix[arch].items():
                name = short(names.get(fn, fn))
                base = re.sub(r"<.*", "", name)
                if not every and base not in ours:
                    continue
                regs, stack, shared = usage.get(arch, {}).get(fn, (0, 0, 0))
                total = sum(v for k, v in c.items() if k not in ("g128", "gall")) or 1
                pct = lambda ops: 100.0 * sum(c[o] for o in ops) / total
                spill = c["LDL"] + c["STL"]
                rows.append((name, regs, warps_by_registers(regs), spill, shared,
                             f"{c['g128']}/{c['gall']}", pct(TENSOR), pct(("MUFU",)), pct(INT_ADDR), pct(FP),
                             pct(MEMORY), total))
                if spill and f"{arch} {name}" not in known:
                    unexpected.append(f"{arch} {name}: {spill} local-memory instructions, stack {stack} bytes")
            for r in sorted(rows):
                print(f"| `{r[0]}` | {r[1]} | {r[2]} | {r[3] or ''} | {r[4]} | {r[5]} | {r[6]:.0f} | {r[7]:.0f} | "
                      f"{r[8]:.0f} | {r[9]:.0f} | {r[10]:.0f} | {r[11]} |")
            print()
    if check:
        if unexpected:
            print("kernel_report: spills not in dev/cuda/known_spills.txt:\n  " + "\n  ".join(unexpected))
            return 1
        print(f"kernel_report: no spill beyond the {len(known)} known ones (dev/cuda/known_spills.txt)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

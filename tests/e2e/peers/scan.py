"""Searched inside the guest, as root, for two values, each given as two
halves on the command line so that this process never holds one whole:

    python3 scan.py REAL_HALF_1 REAL_HALF_2 CONTROL_HALF_1 CONTROL_HALF_2

Every other process's environ, command line and readable memory, the
kernel command line and /tmp/dmesg.txt (if the caller saved dmesg there).
Prints `real: WHERE...` and `control: WHERE...` (or `none`) and how many
processes it could read. Used by tests/e2e/secrets.rs and containment
check 3c (the control is a value the run passed with --env).
"""
import os, sys
a, b, c, d = (x.encode() for x in sys.argv[1:5])
def has(data, x, y):
    i = data.find(x)
    while i >= 0:
        if data[i + len(x):i + len(x) + len(y)] == y:
            return True
        i = data.find(x, i + 1)
    return False
me, found, scanned = os.getpid(), {"real": set(), "control": set()}, 0
def look(where, data):
    for name, (x, y) in (("real", (a, b)), ("control", (c, d))):
        if has(data, x, y):
            found[name].add(where)
for f in ("/proc/cmdline", "/tmp/dmesg.txt"):
    if os.path.exists(f):
        look(f, open(f, "rb").read())
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
    try:
        look(pid + ":environ", open(f"/proc/{pid}/environ", "rb").read())
        look(pid + ":cmdline", open(f"/proc/{pid}/cmdline", "rb").read())
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    scanned += 1
    for line in maps:
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        if "r" not in f[1] or hi - lo > 1 << 28 or f[-1] in ("[vvar]", "[vsyscall]"):
            continue
        try:
            mem.seek(lo)
            look(pid + ":mem", mem.read(hi - lo))
        except (OSError, ValueError, OverflowError):
            pass
for k in ("real", "control"):
    print(f"{k}:", " ".join(sorted(found[k])) or "none")
print("scanned:", scanned)

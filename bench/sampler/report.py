#!/usr/bin/env python3
"""Reads what sampler.c wrote and prints where the samples that passed
through the named binaries were: by innermost frame (a function and line of
those binaries, or another library and the line of theirs that called it),
and by function of theirs anywhere on the stack.

  report.py SAMPLES[,SAMPLES...] NAME=PATH [NAME=PATH...]

NAME is the library's file name as the sampled process loaded it (say
libtidepool.so), PATH a copy of that very binary with its symbols; frames
are resolved with addr2line."""
import collections
import os
import subprocess
import sys


def resolve(path, offsets):
    """addr2line's answer for each offset: (innermost function and
    file:line, outermost function of the inlined chain)."""
    q = [hex(max(int(o, 16) - 1, 0)) for o in offsets]  # return addresses
    out = subprocess.run(['addr2line', '-a', '-f', '-i', '-e', path] + q,
                         capture_output=True, text=True, check=True).stdout
    groups, cur = {}, None
    for line in out.splitlines():
        if line.startswith('0x'):
            cur = int(line, 16)
            groups[cur] = []
        elif cur is not None and line:
            groups[cur].append(line)
    res = {}
    for o, a in zip(offsets, q):
        g = groups.get(int(a, 16)) or ['??', '??:0']
        where = os.path.basename(g[1].split(' ')[0]) if len(g) > 1 else '??'
        res[o] = ('%s %s' % (g[0], where), g[-2] if len(g) >= 2 else g[0])
    return res


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bins = dict(a.split('=', 1) for a in sys.argv[2:])
    samples = [[f.rsplit('+', 1) for f in line.split()]
               for p in sys.argv[1].split(',') for line in open(p)]
    want = collections.defaultdict(set)
    for s in samples:
        for d, o in s:
            if d in bins:
                want[d].add(o)
    sym = {}
    for d, offs in want.items():
        for o, v in resolve(bins[d], sorted(offs)).items():
            sym[(d, o)] = v
    leaf, incl, n = collections.Counter(), collections.Counter(), 0
    for s in samples:
        ours = [i for i, (d, _) in enumerate(s) if d in bins]
        if not ours:
            continue
        n += 1
        first = sym[tuple(s[ours[0]])][0]
        leaf[first if ours[0] == 0 else '%s <- %s' % (s[0][0], first)] += 1
        for name in {sym[tuple(s[i])][1] for i in ours}:
            incl[name] += 1
    print('%d of %d samples pass through %s' % (n, len(samples),
                                                ', '.join(bins)))
    if not n:
        return
    print('\ninnermost frame:')
    for k, v in leaf.most_common(30):
        print('%6.2f%%  %s' % (100.0 * v / n, k))
    print('\nanywhere on the stack:')
    for k, v in incl.most_common(30):
        print('%6.2f%%  %s' % (100.0 * v / n, k))


if __name__ == '__main__':
    main()

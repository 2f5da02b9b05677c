#!/usr/bin/env python3
"""Runs ../shared/policy/policy_lab.py (the Mooncake reference script) in kvtier's cache model, to
tell what in a gap between its figures and kvtier's comes from the model rather than the policy.
Two switches, each one difference between the models (docs/performance.md):
  --full-blocks   every request keeps floor(input_length / 512) blocks: kvtier caches full blocks
                  only, where the script also caches the partial last one (as a class of its own,
                  which its learned index learns to drop and LRU keeps);
  --hold-running  a request's own blocks cannot be evicted while it makes room for them: kvtier
                  holds a running request's KV, where the script may drop what it just computed.
Stdlib only; imports the script and wraps two of its functions; the policy code is the script's.

Usage: python3 bench/replay/offline/policy_lab_kvtier_model.py TRACE [--full-blocks]
           [--hold-running] [--policy-dir ../shared/policy] -- [policy_lab.py's options]
       python3 bench/replay/offline/policy_lab_kvtier_model.py TRACE --full-blocks --write-trace OUT
           (the full-blocks trace alone, for kvtier-policy-sim)
"""
import argparse, json, math, os, sys, tempfile


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument('trace')
    ap.add_argument('--full-blocks', action='store_true')
    ap.add_argument('--hold-running', action='store_true')
    ap.add_argument('--write-trace', default=None,
                    help='with --full-blocks: write the full-blocks trace here and stop')
    ap.add_argument('--policy-dir',
                    default=os.path.join(here, '..', '..', '..', '..', 'shared', 'policy'))
    argv = sys.argv[1:]
    cut = argv.index('--') if '--' in argv else len(argv)
    a, rest = ap.parse_args(argv[:cut]), argv[cut + 1:]
    if not os.path.exists(os.path.join(a.policy_dir, 'policy_lab.py')):
        sys.exit(f'no policy_lab.py in {a.policy_dir} (give --policy-dir)')
    sys.path.insert(0, a.policy_dir)
    import policy_lab as lab
    trace = a.trace
    if a.full_blocks:
        tmp = (open(a.write_trace, 'w') if a.write_trace else
               tempfile.NamedTemporaryFile('w', suffix='.jsonl', delete=False))
        with open(a.trace) as f, tmp:
            for line in f:
                r = json.loads(line)
                k = r['input_length'] // lab.BLK
                if k == 0: continue                      # no full block: nothing to cache or hit
                r['hash_ids'] = r['hash_ids'][:k]; r['input_length'] = k * lab.BLK
                tmp.write(json.dumps(r) + '\n')
        trace = tmp.name
        if a.write_trace: return
        block_class = lab.block_class

        def full_block_class(tr, t, d, scheme):          # no partial block: no 'tail' class
            ids = tr.ids[t]; ids.append(None)            # block_class reads len(ids) only
            try: return block_class(tr, t, d, scheme)
            finally: ids.pop()
        lab.block_class = full_block_class
    if a.hold_running:
        access, prio = lab.TreeCache.access, lab.HDPolicy.prio

        def held_access(self, t, pref):
            self.held = set(self.tr.ids[t])
            try: access(self, t, pref)
            finally: self.held = set()

        def held_prio(self, i, now):                     # never below anything evictable
            return math.inf if i in getattr(self, 'held', ()) else prio(self, i, now)
        lab.TreeCache.access, lab.HDPolicy.prio = held_access, held_prio
    sys.argv = ['policy_lab.py', trace] + rest
    try:
        lab.main()
    finally:
        if a.full_blocks: os.unlink(trace)


if __name__ == '__main__':
    main()

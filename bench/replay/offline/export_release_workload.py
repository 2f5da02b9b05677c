#!/usr/bin/env python3
"""Writes the workload ../shared/policy/policy_lab_agentic.py builds from the Claude Code sessions
(its Workload: session offsets, sub-agents, the shared tool+system prefix, finish = arrival +
api_time) in the release-model format of release_model.h, so kvtier-policy-sim runs the shipped
policies on exactly the requests the script's figures come from. Stdlib only; imports the script.
A sub-agent's end_turn is marked last_turn (ReleaseHints::last_turn), which the script's policies
do not read; --no-last-turn leaves it out, for the figures the script's hint-g is checked against.

Usage: python3 bench/replay/offline/export_release_workload.py OUT.jsonl
           [--policy-dir ../shared/policy] [--seed 1] [--spread 3600] [--no-last-turn]
"""
import argparse, json, os, sys

STOP = ['tool_use', 'end_turn', 'unknown']  # the script's stop classes 0, 1, 2


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument('out')
    ap.add_argument('--policy-dir',
                    default=os.path.join(here, '..', '..', '..', '..', 'shared', 'policy'))
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--spread', type=float, default=3600.0)
    ap.add_argument('--no-last-turn', action='store_true')
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.policy_dir, 'policy_lab_agentic.py')):
        sys.exit(f'no policy_lab_agentic.py in {a.policy_dir} (give --policy-dir)')
    sys.path.insert(0, a.policy_dir)
    import policy_lab_agentic as lab
    tr = lab.Workload(lab.DEFAULT_DIR, a.seed, a.spread, True)
    with open(a.out, 'w') as f:
        f.write(json.dumps({'block_tokens': lab.BLK_TOK}) + '\n')
        for t in range(tr.n):
            line = {'arrival': tr.ts[t], 'finish': tr.fin[t], 'session': tr.sess[t] + 1,
                    'stop': STOP[tr.stop[t]], 'in': tr.ntok[t], 'ids': tr.ids[t]}
            if not a.no_last_turn:
                # A sub-agent's end_turn hands its result to the parent: nothing of the
                # sub-session follows.
                line['last_turn'] = bool(tr.is_sub[t] and STOP[tr.stop[t]] == 'end_turn')
            f.write(json.dumps(line, separators=(',', ':')) + '\n')
    print(f'{a.out}: {tr.n} requests of {tr.nsess} sessions (seed {a.seed}, spread {a.spread:g} s)')


if __name__ == '__main__':
    main()

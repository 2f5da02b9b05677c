#!/usr/bin/env python3
"""How much of a session's idle gap (the client's think_time before its next request) is
predictable from what a cache knows when the request finishes: the stop reason, the session's own
earlier gaps after the same stop reason, and the finished request's output tokens, service time and
output types. Prints, per stop reason, the share of the variance of log(gap) that a least-squares
line on each predictor explains (R^2). Main-agent requests (type "n") of the Claude Code traces, in
order, each paired with the next; gaps under 0.5 s count as 0.5 s. Stdlib only.

Usage: python3 bench/replay/offline/idle_gap_predictability.py [TRACE_DIR]
       (default ../shared/traces/kv-cache-tester-claude-code from the project root)
"""
import collections, glob, json, math, os, statistics as st, sys


def r_squared(xs, ys):
    mx, my = st.mean(xs), st.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0: return 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return 1 - st.mean((my + b * (x - mx) - y) ** 2 for x, y in zip(xs, ys)) / st.pvariance(ys)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, '..', '..', '..', '..', 'shared', 'traces', 'kv-cache-tester-claude-code')
    files = sorted(glob.glob(os.path.join(folder, 'trace_*.json')))
    if not files: sys.exit(f'no trace_*.json in {folder}')
    history = collections.defaultdict(list)  # stop -> (last, ewma, median of 5, log gap)
    request = collections.defaultdict(list)  # stop -> (log out, log api, thinking, text, log gap)
    for path in files:
        with open(path) as f: reqs = [q for q in json.load(f)['requests'] if q.get('type') == 'n']
        earlier = collections.defaultdict(list)  # this session's log gaps per stop reason
        for a, b in zip(reqs, reqs[1:]):
            stop = a.get('stop') or 'unknown'
            y = math.log(max(b['think_time'], 0.5))
            h = earlier[stop]
            if h:
                e = h[0]
                for x in h[1:]: e = 0.7 * e + 0.3 * x
                history[stop].append((h[-1], e, st.median(h[-5:]), y))
            h.append(y)
            request[stop].append((math.log(a['out'] + 1), math.log(a['api_time'] + 0.1),
                                  float('thinking' in a['output_types']),
                                  float('text' in a['output_types']), y))
    for stop in sorted(request):
        rows = history[stop]
        if len(rows) > 2:
            ys = [r[-1] for r in rows]
            cells = ', '.join(f'{n} {r_squared([r[i] for r in rows], ys):.3f}'
                              for i, n in enumerate(('last gap', 'ewma 0.3', 'median of 5')))
            print(f'{stop}: {len(rows)} gaps with an earlier one; R^2 on the session\'s earlier '
                  f'gaps: {cells}')
        rows = request[stop]
        if len(rows) > 2:
            ys = [r[-1] for r in rows]
            cells = ', '.join(f'{n} {r_squared([r[i] for r in rows], ys):.3f}' for i, n in
                              enumerate(('output tokens', 'service time', 'thinking', 'text')))
            print(f'{stop}: {len(rows)} gaps; R^2 on the finished request: {cells}')


if __name__ == '__main__':
    main()

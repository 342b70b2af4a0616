# The trace of a snapshot repeated: python3 repeat_trace.py SOURCE OUT COPIES. Each copy
# is shifted to other addresses and later times, as new objects, so the pickle has the shape
# of a long recording. Prints the events of the longest trace. (The benchmarks run it.)
import copy, lzma, pickle, sys
source, out, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
with lzma.open(source) as f: snap = pickle.load(f)
traces = snap['device_traces']
dev = max(range(len(traces)), key=lambda d: len(traces[d]))
trace = traces[dev]
span = trace[-1]['time_us'] - trace[0]['time_us'] + 1000
shift = 1 << 40
longer = []
for k in range(copies):
    for e in trace:
        c = dict(e)
        if k:
            c['addr'] = e['addr'] + k * shift if e['action'] != 'oom' else e['addr']
            c['time_us'] = e['time_us'] + k * span
        c['frames'] = list(e['frames'])
        longer.append(c)
traces[dev] = longer
with open(out, 'wb') as f: pickle.dump(snap, f, protocol=4)
print(len(longer))

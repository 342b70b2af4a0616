"""Writes values_p{0..5}.pickle (one object per pickle protocol) and the expected rendering.

Run with any Python 3.8+: `python3 make.py`. The rendering matches `memsnap::pickle::Heap::render`.
"""

import json
import pickle

shared_dict = {"k": "v"}
shared_list = [1, 2]
BASE = {
    "ints": [0, 1, -1, 255, 256, 65535, 65536, -(2**31), 2**31 - 1, 2**31, 2**63 - 1, 2**63,
             2**64, -(2**63) - 1, 2**100, -(2**100)],
    "floats": [0.5, -2.25],
    "strs": ["", "a", "ünï ✓", "x" * 300],
    "consts": [True, False, None],
    "t1": (1,), "t2": (1, 2), "t3": (1, 2, 3), "t4": (1, 2, 3, 4), "empty": (),
    "shared": [shared_dict, shared_dict, shared_list, shared_list],
    "nested": [[[]], {}],
}


def render(v):
    if v is None or v is True or v is False:
        return str(v)
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, bytes):
        return "b" + json.dumps(v.decode("latin-1"))
    if isinstance(v, (set, frozenset)):
        return "[" + ", ".join(render(x) for x in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + ", ".join(render(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(render(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return "{" + ", ".join(render(k) + ": " + render(x) for k, x in v.items()) + "}"


for proto in range(6):
    obj = dict(BASE)
    if proto >= 3:  # bytes before protocol 3 need REDUCE
        obj["bytes"] = b"ab~"
    if proto >= 4:  # sets before protocol 4 need REDUCE
        obj["set"] = {7}
        obj["frozen"] = frozenset({8})
    with open(f"values_p{proto}.pickle", "wb") as f:
        f.write(pickle.dumps(obj, protocol=proto))
    with open(f"values_p{proto}.txt", "w") as f:
        f.write(render(obj) + "\n")

"""Make the pipeline's memory prints carry memory_allocated() in exact bytes.

The line count of dualpipev.py is unchanged, so recorded frames keep their line numbers.
"""
import sys
p = sys.argv[1]
s = open(p).read()
a = '    return f"alloc={allocated / G:.2f} cached='
assert s.count(a) == 1
s = s.replace(a, '    return f"bytes={allocated} alloc={allocated / G:.2f} cached=')
open(p, "w").write(s)

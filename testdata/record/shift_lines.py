"""Insert comment lines after the module docstring, shifting every line number below."""
import sys
path, n = sys.argv[1], int(sys.argv[2])
lines = open(path).read().split("\n")
if lines[0].count('"""') == 2:
    end = 1
else:
    end = next(i for i, l in enumerate(lines) if i > 0 and l.rstrip().endswith('"""')) + 1
lines[end:end] = [f"# fork note {i}: this checkout carries local changes" for i in range(n)]
open(path, "w").write("\n".join(lines))

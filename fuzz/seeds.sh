#!/usr/bin/env bash
# Builds the seed corpus of every fuzz target in fuzz/corpus/<target>/:
# - every testdata and shared snapshot, decompressed when under 64 KiB, else cut by
#   `memsnap trim` to the 40 events around its peak (a few KiB, so that each run is fast);
# - the values pickles of testdata/pickle (protocols 0 to 5);
# - small hostile constructions (memo, container, MARK and FRAME floods, huge length prefixes,
#   shared segments and trace lists, sizes near 2^64);
# - allocator settings strings and a rules file for the `settings` target;
# - command lines (arguments separated by NUL bytes) for the `cli` target;
# - for `flat`, the `decode` and `split` seeds together.
# Usage: fuzz/seeds.sh [path to a memsnap binary]
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/memsnap}"
out=fuzz/corpus
mkdir -p "$out/decode" "$out/settings" "$out/split"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
for f in $(find testdata ../shared/snapshots -name '*.pickle*' 2>/dev/null | sort); do
  n=$((n + 1))
  case "$f" in
    *.xz) xz -dc "$f" > "$tmp/plain" ;;
    *) cp "$f" "$tmp/plain" ;;
  esac
  size=$(stat -c %s "$tmp/plain")
  # decoding in parts needs a few 64 KiB frames: the snapshots of 80 to 600 KB as they are
  if [ "$size" -ge 80000 ] && [ "$size" -le 600000 ]; then
    cp "$tmp/plain" "$out/split/snapshot-$n.pickle"
  fi
  if [ "$size" -le 65536 ]; then
    cp "$tmp/plain" "$out/decode/snapshot-$n.pickle"
  else
    "$bin" trim --quiet "$tmp/plain" --around-peak 40 -o "$tmp/cut-$n.pickle" >/dev/null 2>&1 \
      && cp "$tmp"/cut-$n*.pickle "$out/decode/" || true
    rm -f "$tmp"/cut-$n*.pickle
  fi
done
python3 - "$out/decode" <<'PY'
import os, struct, sys
d = sys.argv[1]
def w(name, data):
    open(os.path.join(d, name), "wb").write(data)
P = b"\x80\x04"
w("memoize", P + b"N" + b"\x94" * 5000 + b".")
w("empty-lists", P + b"(" + b"]" * 5000 + b"1N.")
w("marks", P + b"(1" * 5000 + b"N.")
w("frames", P + (b"\x95" + struct.pack("<Q", 0)) * 1000 + b"N.")
w("long-prefix", P + b"\x8d" + struct.pack("<Q", 1 << 62) + b"abc")
w("sparse-memo", P + b"N" + b"".join(b"r" + struct.pack("<I", 0xFFFFFFFF - i) for i in range(500)) + b".")
def t(s): return b"\x8c" + bytes([len(s)]) + s.encode()
def i(v): return b"J" + struct.pack("<i", v)
ev = lambda a, addr, size: b"}(" + t("action") + t(a) + t("addr") + i(addr) + t("size") + size + t("stream") + i(0) + t("time_us") + i(addr) + b"u"
big = b"\x8a\x09" + (2**64 - 1).to_bytes(9, "little")
trace = ev("segment_alloc", 1 << 20, i(2 << 20)) + ev("alloc", 1 << 20, i(512)) + ev("alloc", 1 << 21, big) + ev("free_requested", 1 << 20, i(512)) + ev("free_completed", 1 << 20, i(512))
w("huge-sizes", P + b"}(" + t("segments") + b"]" + t("device_traces") + b"]((" + trace + b"leu.")
w("shared-trace", P + b"}(" + t("segments") + b"]" + t("device_traces") + b"]((" + ev("alloc", 0, i(512)) + b"lr\x07\x00\x00\x00j\x07\x00\x00\x00eu.")
PY
for file in testdata/pickle/*.pickle; do cp "$file" "$out/decode/"; done
cp -r "$out/decode/." "$out/analyse/" 2>/dev/null || { mkdir -p "$out/analyse"; cp -r "$out/decode/." "$out/analyse/"; }
mkdir -p "$out/simulate" && cp -r "$out/decode/." "$out/simulate/"
printf 'expandable_segments:True' > "$out/settings/expandable"
printf 'max_split_size_mb:256,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]' > "$out/settings/split"
printf 'garbage_collection_threshold:0.6,max_split_size_mb:64' > "$out/settings/gc"
printf '9.04GiB' > "$out/settings/size"
cp examples/rules.toml "$out/settings/rules.toml"
# command lines for `cli`: arguments separated by NUL bytes
mkdir -p "$out/cli"
printf 'report\0a.pickle\0--by\0step,op\0--top\x005\0--device\x000' > "$out/cli/report"
printf 'timeline\0a.pickle\0-o\0t.png\0--width\x00700\0--x\0auto' > "$out/cli/timeline"
printf 'whatif\0a.pickle\0--cap\x009.04GiB\0--try\0expandable_segments:True\0--min-cap' > "$out/cli/whatif"
printf 'compare\0-r\0dir\0--markdown\0--png\0c.png' > "$out/cli/compare"
printf 'oom\0a.pickle\0--cap-fraction\x000.5\0--json' > "$out/cli/oom"
printf 'flamegraph\0a.pickle\0--at\0#12\0--root\0stage\0--folded' > "$out/cli/flamegraph"
printf 'export\0a.pickle\0-o\0t/\0--format\0csv\0--device\x001' > "$out/cli/export"
printf 'trim\0a.pickle\0--from\x001s\0--to\x002.5s\0-o\0b.pickle.xz' > "$out/cli/trim"
printf -- '--max-memory\x008GiB\0--force\0completions\0bash' > "$out/cli/global"
# the decode seeds again with frames of 256 B to 2 KiB instead of 64 KiB, so that inputs of a
# few KiB already decode in parts (`split-small`, a faster run of the `split` target)
mkdir -p "$out/split-small"
python3 - "$out/decode" "$out/split-small" <<'PY'
import os, pickletools, struct, sys
src, dst = sys.argv[1:]
for k, name in enumerate(sorted(os.listdir(src))):
    data = open(os.path.join(src, name), "rb").read()
    if data[:2] != b"\x80\x04":
        continue
    try:
        ops = [(pos, op.name) for op, _, pos in pickletools.genops(data)]
    except Exception:
        continue
    ends = [pos for pos, _ in ops[2:]] + [len(data)]
    size = 256 << (k % 4)
    out, frame = [data[:2]], b""
    for (pos, opname), end in zip(ops[1:], ends):
        if opname != "FRAME":
            frame += data[pos:end]
        if len(frame) >= size:
            out.append(b"\x95" + struct.pack("<Q", len(frame)) + frame)
            frame = b""
    if frame:
        out.append(b"\x95" + struct.pack("<Q", len(frame)) + frame)
    open(os.path.join(dst, name), "wb").write(b"".join(out))
PY
# trace entries read whole against opcode by opcode: the decode and split seeds together
mkdir -p "$out/flat"
cp "$out/decode"/* "$out/split"/* "$out/flat/"
# the page writer: a title and a file name holding slots, markup and a bidi control, then each
# decode seed
mkdir -p "$out/page"
for f in "$out/decode"/*; do
    { printf 'x{{data}}</title>\0r\xe2\x80\xaeank3_{{script}}.pickle\0'; cat "$f"; } \
        > "$out/page/$(basename "$f")"
done
# the MCP server: paths a client may ask for (in the root, out through links, a pipe), and
# request lines, one of them over the target's 256-byte limit
mkdir -p "$out/mcp"
printf 'sub/a.pickle\n../outside/secret\nout/secret\nleak\ndangling\nfifo\n' > "$out/mcp/paths"
printf 'sub/../../outside/new\n/tmp\nsub/./a.pickle\nout/../sub\n' > "$out/mcp/dots"
printf '{"jsonrpc":"2.0","id":1,"method":"tools/list"}\n' > "$out/mcp/list"
python3 -c "print('{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"x\",\"params\":\"' + 'a' * 400 + '\"}')" \
    > "$out/mcp/long"
echo "seeds: $(ls "$out/decode" | wc -l) pickles, $(ls "$out/settings" | wc -l) texts"

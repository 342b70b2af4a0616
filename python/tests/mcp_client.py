"""`memsnap mcp` driven by the official MCP Python SDK (`pip install mcp`) as a client: every
tool, a path outside the roots, a missing file and a hostile pickle, and the server still
serving after them. The server's root is `testdata`, and paths are relative to it. Run from the
repository root: `python python/tests/mcp_client.py`."""

import asyncio
import json
import os
import sys
import tempfile

import memsnap
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SNAPSHOT = "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"
PRINTED_PEAK = 3090155008


def check(condition, what):
    if not condition:
        sys.exit(f"mcp client test failed: {what}")
    print(f"ok: {what}")


async def call(session, tool, arguments):
    """The tool's JSON, or ("error", message) for an MCP error or an error result."""
    try:
        result = await session.call_tool(tool, arguments)
    except Exception as e:  # the SDK raises on a JSON-RPC error
        return ("error", str(e))
    text = result.content[0].text if result.content else ""
    if getattr(result, "isError", False) or getattr(result, "is_error", False):
        return ("error", text)
    return json.loads(text)


async def main():
    params = StdioServerParameters(command=memsnap.binary(), args=["mcp", "--root", "testdata"])
    async with stdio_client(params) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            names = sorted(t.name for t in tools.tools)
            check(names == ["compare", "diff", "live_at", "oom", "report", "steps", "timeline", "top_sites", "whatif"], f"tools/list {names}")
            report = await call(session, "report", {"path": SNAPSHOT})
            check(report["devices"][0]["peak_allocated_bytes"] == PRINTED_PEAK, "report: the printed peak")
            steps = await call(session, "steps", {"path": SNAPSHOT})
            check(steps["steps"] == report["devices"][0]["steps"], "steps: the report's step table")
            sites = await call(session, "top_sites", {"path": SNAPSHOT, "top": 2})
            check(len(sites["top_sites"]) == 2, "top_sites")
            live = await call(session, "live_at", {"path": SNAPSHOT, "at": "peak"})
            check(live["allocated_bytes"] == PRINTED_PEAK, "live_at peak: the printed peak")
            oom = await call(session, "oom", {"path": "snapshots/allocator/cap_mid.pickle.xz"})
            check(oom["devices"][0]["oom"]["verdict"] == "fragmentation", "oom: the verdict")
            whatif = await call(session, "whatif", {"path": "snapshots/allocator/default.pickle.xz", "settings": ["expandable_segments:True"]})
            check(whatif["devices"][0]["simulated"][0]["alloc_conf"] == "expandable_segments:True", "whatif")
            ranks = await call(session, "compare", {"paths": ["snapshots/fsdp"]})
            check(len(ranks["rows"]) == 2, "compare: a folder of two ranks")
            with tempfile.TemporaryDirectory(dir="testdata") as d:
                out = os.path.join(os.path.basename(d), "t.png")
                drawn = await call(session, "timeline", {"path": SNAPSHOT, "output": out})
                written = os.path.join("testdata", out)
                check(os.path.isfile(written) and drawn["written"] == out, "timeline writes the PNG")
            outside = await call(session, "report", {"path": "/etc/hostname"})
            check(outside[0] == "error" and "outside" in outside[1], "a path outside the roots is an error")
            missing = await call(session, "report", {"path": "no-such.pickle"})
            check(missing[0] == "error", "a missing file is an error")
            hostile = await call(session, "report", {"path": "fuzz/memoize.pickle"})
            check(hostile[0] == "error", "a hostile pickle is an error")
            again = await call(session, "steps", {"path": SNAPSHOT})
            check(again["steps"] == steps["steps"], "the server still serves")


if __name__ == "__main__":
    asyncio.run(main())

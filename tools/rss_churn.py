#!/usr/bin/python3
"""rss_churn.py: what a burst of idle and slow connections leaves in a
running flashsale's memory.

    tools/rss_churn.py --port PORT --pid PID [--idle 3000] [--slow 400] [--rounds 3]

Each round opens IDLE keep-alive connections that each make one
GET /healthz and then sit idle, and SLOW connections that send the start
of a request a few bytes at a time and never finish it; holds them all
for --hold seconds; then closes every one. It prints the service's RSS
(/proc/PID/status) before the first round and after each phase, so that
memory kept after the connections are gone shows as the difference
between "before" and "after". Only 127.0.0.1; every socket it opens is
closed before it exits. docs/performance.md ("Memory") has the figures."""
import argparse
import socket
import sys
import time


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def idle_conns(port, n):
    """n connections, each answered once and then left idle."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        out.append(s)
    for s in out:                        # read each answer (one recv is enough here)
        s.recv(65536)
    return out


def slow_conns(port, n, hold):
    """n connections trickling a request head for hold seconds."""
    out = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
    head = b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Slow: "
    for s in out:
        s.sendall(head)
    end = time.monotonic() + hold
    while time.monotonic() < end:
        for s in out:
            try:
                s.sendall(b"a")
            except OSError:
                pass
        time.sleep(0.5)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--idle", type=int, default=3000)
    ap.add_argument("--slow", type=int, default=400)
    ap.add_argument("--hold", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    print("before      rss %6.1f MB" % (rss_kb(a.pid) / 1024))
    for r in range(a.rounds):
        idle = idle_conns(a.port, a.idle)
        slow = slow_conns(a.port, a.slow, a.hold)
        print("round %d open  rss %6.1f MB  (%d idle, %d slow)" % (r + 1, rss_kb(a.pid) / 1024,
                                                                   len(idle), len(slow)))
        for s in idle + slow:
            s.close()
        time.sleep(2.0)                  # the service notices the closes and frees them
        print("round %d after rss %6.1f MB" % (r + 1, rss_kb(a.pid) / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""with_postgres.py: runs a command against a throwaway PostgreSQL server.

    tools/with_postgres.py CMD ARG...    every "{url}" in the arguments becomes
                                         the URL of a fresh database on it

The server is the tests' own (tests/pgserver.py): initdb in a temp dir, a
free port on 127.0.0.1, started as the postgres user when run as root,
stopped by its PID when the command ends (or is interrupted). Exits with
the command's status. `make demo-pg` runs the comparison this way."""
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import harness  # noqa: E402


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 64
    pg = harness.Postgres()
    try:
        url = pg.database("flashsale")
        print("with_postgres: PostgreSQL at %s (data in %s)" % (url, pg.dir), file=sys.stderr)
        cmd = [a.replace("{url}", url) for a in sys.argv[1:]]
        p = subprocess.Popen(cmd)
        try:
            return p.wait()
        except KeyboardInterrupt:
            p.send_signal(signal.SIGINT)
            return p.wait()
    finally:
        pg.stop()
        harness.stop_all()


if __name__ == "__main__":
    sys.exit(main())

#!/bin/sh
# npm-deps.sh: install the Node.js packages the tests use (tools/node:
# the OpenAPI linter, node-redlock and ioredis), exactly as
# tools/node/package-lock.json pins them, with `npm ci`. A quick no-op when
# they are installed and the lock file has not changed since, so `make
# test-run` can always call it. Needs Node.js >= 20.19 and npm (the
# machines this project runs on have them; Debian 12's own nodejs is 18,
# too old for the linter).
set -eu
dir=$(cd "$(dirname "$0")/node" && pwd)
stamp="$dir/node_modules/.package-lock.json"
if [ -f "$stamp" ] && [ "$stamp" -nt "$dir/package-lock.json" ] &&
   [ "$stamp" -nt "$dir/package.json" ]; then
    exit 0
fi
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || {
    echo "npm-deps: need Node.js >= 20.19 and npm on PATH" >&2; exit 1; }
node -e 'const [a,b]=process.versions.node.split(".").map(Number);
         process.exit(a>20||(a===20&&b>=19)?0:1)' || {
    echo "npm-deps: Node.js $(node --version) is too old: need >= 20.19" >&2; exit 1; }
echo "npm-deps: installing tools/node (npm ci)"
cd "$dir"
npm ci --no-audit --no-fund --loglevel=error >/dev/null
touch "$stamp"
echo "npm-deps: done"

// redlock_holder.js: a node-redlock (v5, over ioredis) client that holds a
// lock when told to, for tests/test_lock.py's hand-off measurement. It is
// the kind of foreign client flashlock must coexist with: it takes the key
// with SET NX PX and frees it with a Lua GET-compare-DEL, publishing nothing.
//
// Usage: node redlock_holder.js PORT KEY
// Reads commands, one per line, on stdin:
//   acquire   take KEY (ttl 30 s, no retries: it must be free); answers "held"
//   release   frees KEY; answers "released"
//   quit      closes the connection and exits
// Anything unexpected is written as "error <message>" and ends the process.
"use strict";
const Redis = require("ioredis");
const { default: Redlock } = require("redlock");
const readline = require("readline");

const [port, key] = process.argv.slice(2);
const redis = new Redis({ host: "127.0.0.1", port: Number(port), maxRetriesPerRequest: 1 });
const redlock = new Redlock([redis], { retryCount: 0 });
let lock = null;

function fail(e) {
  process.stdout.write("error " + (e && e.message ? e.message : String(e)) + "\n");
  process.exit(1);
}

const lines = readline.createInterface({ input: process.stdin });
lines.on("line", async (cmd) => {
  try {
    if (cmd === "acquire") {
      lock = await redlock.acquire([key], 30000);
      process.stdout.write("held\n");
    } else if (cmd === "release") {
      await lock.release();
      lock = null;
      process.stdout.write("released\n");
    } else if (cmd === "quit") {
      await redis.quit();
      process.exit(0);
    } else {
      fail("unknown command " + cmd);
    }
  } catch (e) {
    fail(e);
  }
});
lines.on("close", () => process.exit(0));

-- lock_write.lua: the `lock` strategy's second round trip: the fenced
-- write of the read-check-write (when the check passed; lock_steps.lua's
-- lock_step_write), then the release of the lock, in one atomic step. The
-- release is the lock module's (lock/lua/format.lua's lock_release):
-- compare-and-delete, then wake the next live waiter of the blocking path,
-- as lock_release does; `fair-lock`'s wakes the head of its line.
--
-- KEYS[1] lock   KEYS[2] the lock's waiter queue   KEYS[3] gen   KEYS[4] pending
-- KEYS[5] users   KEYS[6] idem record   KEYS[7] empty-segment bitmap
-- KEYS[8] the segment's stock   KEYS[9] the segment's fence
-- KEYS[10..12] `fair-lock`'s line: queue, due, sub (with ARGV[18]; `lock`: neither)
-- ARGV[1] owner id   ARGV[2] wake channel prefix   ARGV[3] run_id   ARGV[4] gen read
-- ARGV[5] token   ARGV[6] 'write' or 'release' (the check refused: release only)
-- ARGV[7] segment index   ARGV[8] segments   ARGV[9] the value the read implies (not
-- written: see the write)   ARGV[10] units taken
-- ARGV[11] order_id   ARGV[12] user_id   ARGV[13] per-user limit   ARGV[14] fingerprint
-- ARGV[15] idem TTL ms   ARGV[16] instance   ARGV[17] pending record tail
-- ARGV[18] '1': fair-lock (its release wakes the head of its line); absent: `lock`
-- Returns {1, gen, spec} written, {0} released only, {-3} copy gone or rebuilt,
-- {-4} fenced off (a newer holder wrote): nothing written in those two.
local res, now = lock_step_write(KEYS, ARGV)
if ARGV[18] == '1' then
    lock_fair_release(KEYS[1], KEYS[10], KEYS[11], KEYS[12], ARGV[1], ARGV[2], now)
else
    lock_release(KEYS[1], KEYS[2], ARGV[1], ARGV[2], 1)
end
return res

-- lock_pass.lua: `fair-lock`'s hand-off on an event loop: an order's
-- fenced write (lock_steps.lua's lock_step_write, as lock_write.lua), then
-- the lock handed straight to the next order of the same instance, with
-- that order's read (lock_step_read, as lock_read.lua), in one atomic step.
-- The lock goes to the next order only if it is the head of the line (or
-- the line is empty): a fair lock's release hands the lock to the head, and
-- here the head's take came with the release. Otherwise this is
-- lock_write.lua's release (the head woken) and the next order's
-- lock_read.lua, one after the other. Either way the reply is what those
-- two scripts, run back to back, would answer -- without the lock freed and
-- taken again, its line read twice, or a second script call.
-- KEYS[1..12] lock_write.lua's   KEYS[13] the lock's token counter
-- KEYS[14] the next order's idem record
-- ARGV[1..18] lock_write.lua's (ARGV[18] '1')   ARGV[19] the next order's owner id
-- ARGV[20] its lease ms   ARGV[21] its user_id   ARGV[22] a place's lease ms
-- ARGV[23] the line's keys' ttl ms   ARGV[24..] owner ids of the orders behind it
-- not in line yet (lock_read.lua's ARGV[8..])
-- Returns {lock_write.lua's reply, lock_read.lua's reply}.
if redis.replicate_commands then redis.replicate_commands() end
local lock, queue, due, sub = KEYS[1], KEYS[10], KEYS[11], KEYS[12]
local res, now = lock_step_write(KEYS, ARGV)
local from, seen = nil, nil
if lock_ours(lock, ARGV[1]) then
    seen = lock_fair_head(queue)
    if not seen or seen == ARGV[19] then from = ARGV[1] end
end
if not from then lock_fair_release(lock, queue, due, sub, ARGV[1], ARGV[2], now) end
local A = {ARGV[19], ARGV[20], ARGV[3], ARGV[21], ARGV[22], ARGV[23], ARGV[2]}
for i = 24, #ARGV do A[#A + 1] = ARGV[i] end
local K = {lock, KEYS[13], KEYS[3], KEYS[5], KEYS[14], KEYS[8], KEYS[9], queue, due, sub}
return {res, lock_step_read(K, A, from, seen, now)}
